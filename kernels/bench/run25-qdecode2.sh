#!/bin/bash
# run 25 (one GPU): the persistent compressed decode GEMM after run 24 (one LOP3 per int4 pair,
# ldmatrix offsets computed once). Checks (quick, with the golden fixtures and tiny-r1-awq), the
# qgemm_tune sweep, then decode steps in AWQ and FP8 on V2-Lite and on 4 layers of the V3 shape,
# tiled vs persistent (and AWQ's widest shape), bf16 beside them. Expects the stripped binary in .carry/.
source kernels/bench/lib.sh
( for d in awq fp8 bf16; do $C gen-checkpoint --shape v2-lite --dtype $d --out /dev/shm/v2lite-$d > /dev/null 2>&1; done
  for d in awq fp8; do $C gen-checkpoint --shape v3-layers --dtype $d --out /dev/shm/v3l4-$d > /dev/null 2>&1; done ) &
GP=$!
S=$(date +%s)
timeout 170 $C kernels-check --quick --stages quant,qdecode --golden models/golden --compare-model models/tiny-r1-awq > $OUT/quick.txt 2>&1
echo "quick rc=$? $(( $(date +%s) - S )) s"; grep -E "over tol|FAIL|failed|rror|panic|DIFF|within tolerance" $OUT/quick.txt | head -8
S=$(date +%s)
timeout 150 $C kernels-check --stages qgemm_tune > $OUT/tune.txt 2>&1; echo "tune rc=$? $(( $(date +%s) - S )) s"
grep -E "over tol|failed|rror|panic" $OUT/tune.txt | head -5
sed -n '/^qgemm_tune:/,$p' $OUT/tune.txt | grep -E "tok" | cut -c1-190
grep -E "qgp awq g(64|128) .*(V3|V2-Lite) (16|64) tok" $OUT/tune.txt | cut -c1-150
wait $GP
bench() {  # name model batches ctx variant
  S=$(date +%s)
  CLEAVE_QGEMM=$5 timeout 100 $C kernels-check --no-ops --bench-model $2 --batches $3 --ctx $4 --prefill 0 > $OUT/bench-$1-${5//[:\/]/_}.txt 2>&1
  echo "bench $1 $5 rc=$? $(( $(date +%s) - S )) s"
  grep -E "^ +[0-9]+ +[0-9.]+ " $OUT/bench-$1-${5//[:\/]/_}.txt | cut -c1-110
}
for d in awq fp8; do
  for q in tiled persistent; do bench v2lite-$d /dev/shm/v2lite-$d 1,16,64,256 1024 $q; done
done
bench v2lite-awq /dev/shm/v2lite-awq 16,64,256 1024 persistent:256/64/4
bench v2lite-bf16 /dev/shm/v2lite-bf16 1,16,64,256 1024 persistent
rm -rf /dev/shm/v2lite-*
for d in awq fp8; do
  for q in tiled persistent; do bench v3l4-$d /dev/shm/v3l4-$d 1,64,256 2048 $q; done
done
bench v3l4-awq /dev/shm/v3l4-awq 64,256 2048 persistent:256/64/4
