#!/bin/bash
# run 46 (one GPU): bf16 shared experts above 64 rows and every format's at prefill as one
# gate/up GEMM over their slots, SiLU over the pairs and each slot's down projection accumulated
# (beta 1) into the output. The quick pass with golden fixtures and tiny-r1, the experts stage,
# then the bf16 V2-Lite decode at batch 1/64/128/256 and the 4096-token prefill, folded and
# separate (CLEAVE_SHARED_EXPERTS=separate) in the same run.
source kernels/bench/lib.sh
S=$(date +%s)
$C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1 &
GP=$!
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run46-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run46-checks.txt)"
grep -iE "fail|panic|graphs vs eager" $OUT/run46-checks.txt | cut -c1-150 | head -14
timeout 100 $C kernels-check --stages experts > $OUT/run46-experts.txt 2>&1
echo "experts rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run46-experts.txt)"
grep -E "moe_experts (v2|shared v2) " $OUT/run46-experts.txt | cut -c1-170
wait $GP
for mode in folded separate; do
  CLEAVE_SHARED_EXPERTS=$mode timeout 170 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,64,128,256 > $OUT/run46-v2lite-$mode.txt 2>&1
  echo "bench $mode rc=$? $(( $(date +%s) - S )) s"
  grep -E "^ +[0-9]+ +[0-9.]+ |CUDA graph|^  [0-9.]+ ms, |profile (decode batch 1|prefill)|rror" $OUT/run46-v2lite-$mode.txt | cut -c1-330
done
rm -rf /dev/shm/v2lite
