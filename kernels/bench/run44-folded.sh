#!/bin/bash
# run 44 (one GPU): shared experts folded into the routed grouped GEMMs. The quick pass (router
# with shared experts, every format's experts with two shared ones, decode and prefill sizes),
# golden fixtures and tiny-r1 (graphs vs eager, CPU, HF); the experts stage at V2-Lite shapes;
# the bf16 V2-Lite decode at batch 1/64/256 and the 4096-token prefill, folded (the default) and
# with CLEAVE_SHARED_EXPERTS=separate (the dense shared MLP of before) in the same run.
source kernels/bench/lib.sh
S=$(date +%s)
$C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1 &
GP=$!
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run44-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run44-checks.txt)"
grep -iE "fail|panic|graphs vs eager|shared|moe_route" $OUT/run44-checks.txt | cut -c1-150 | head -30
timeout 100 $C kernels-check --stages experts > $OUT/run44-experts.txt 2>&1
echo "experts rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run44-experts.txt)"
grep -E "moe_experts (v2|shared) " $OUT/run44-experts.txt | cut -c1-170
wait $GP
for mode in folded separate; do
  CLEAVE_SHARED_EXPERTS=$mode timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,64,256 > $OUT/run44-v2lite-$mode.txt 2>&1
  echo "bench $mode rc=$? $(( $(date +%s) - S )) s"
  grep -E "^ +[0-9]+ +[0-9.]+ |CUDA graph|^  [0-9.]+ ms, |profile|rror" $OUT/run44-v2lite-$mode.txt | cut -c1-330
done
rm -rf /dev/shm/v2lite
