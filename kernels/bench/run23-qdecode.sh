#!/bin/bash
# run 23 (one GPU): the persistent decode GEMM over compressed weights (issue 12). Expects the
# stripped release binary in .carry/.
# 1. kernels-check quick: the exact compressed paths (AWQ persistent, then tiled), the qdecode stage
#    (FP8 on FP8 tensor cores), the golden AWQ/FP8 fixtures and tiny-r1-awq end to end.
# 2. The qdecode stage at DeepSeek sizes, then the qgemm_tune sweep (NOTUNE=1 skips it).
# 3. V2-Lite decode in AWQ and FP8 with CLEAVE_QGEMM=tiled and =persistent, bf16 beside them.
source kernels/bench/lib.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
( for d in awq fp8 bf16; do $C gen-checkpoint --shape v2-lite --dtype $d --out /dev/shm/v2lite-$d > /dev/null 2>&1; done ) &
GP=$!
S=$(date +%s)
timeout 170 $C kernels-check --quick --stages quant,qdecode --golden models/golden --compare-model models/tiny-r1-awq > $OUT/quick.txt 2>&1
echo "quick rc=$? $(( $(date +%s) - S )) s"
grep -E "over tol|FAIL|failed|rror|panic|DIFF" $OUT/quick.txt | head -20
grep -A14 "^golden" $OUT/quick.txt | head -16
S=$(date +%s)
timeout 150 $C kernels-check --stages qdecode > $OUT/qdecode.txt 2>&1; echo "qdecode rc=$? $(( $(date +%s) - S )) s"
grep -E "persistent|tiled|act_quant|over tol|failed|rror|panic" $OUT/qdecode.txt | cut -c1-170
if [ -z "$NOTUNE" ]; then
  S=$(date +%s)
  timeout 150 $C kernels-check --stages qgemm_tune > $OUT/tune.txt 2>&1; echo "tune rc=$? $(( $(date +%s) - S )) s"
  grep -E "over tol|failed|rror|panic" $OUT/tune.txt | head -5
  sed -n '/^qgemm_tune:/,$p' $OUT/tune.txt | cut -c1-190
fi
wait $GP
for d in awq fp8 bf16; do
  for q in ${QGEMMS:-tiled persistent}; do
    [ $d = bf16 ] && [ $q = tiled ] && continue
    S=$(date +%s)
    CLEAVE_QGEMM=$q timeout 90 $C kernels-check --no-ops --bench-model /dev/shm/v2lite-$d --batches 1,16,64,256 --prefill 0 > $OUT/bench-$d-$q.txt 2>&1
    echo "bench $d $q rc=$? $(( $(date +%s) - S )) s"
    grep -E "^ +[0-9]+ +[0-9.]+ " $OUT/bench-$d-$q.txt | cut -c1-150
  done
done
