#!/bin/bash
# run 45 (one GPU): folded shared experts up to 64 rows (dense GEMMs over their slots above).
# The experts stage (shared experts at 1, 64, 256 and 4096 tokens against the CPU), the bf16
# V2-Lite decode at batch 1/64/128/256 (folded and separate), then the real model's share (61 V3
# layers in AWQ, 64 routed experts + the shared expert folded) at batch 1/64/128.
source kernels/bench/lib.sh
S=$(date +%s)
$C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1 &
GP=$!
timeout 100 $C kernels-check --stages experts > $OUT/run45-experts.txt 2>&1
echo "experts rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run45-experts.txt)"
grep -E "moe_experts shared v2 " $OUT/run45-experts.txt | cut -c1-170
wait $GP
for mode in folded separate; do
  CLEAVE_SHARED_EXPERTS=$mode timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,64,128,256 --prefill 0 > $OUT/run45-v2lite-$mode.txt 2>&1
  echo "bench $mode rc=$? $(( $(date +%s) - S )) s"
  grep -E "^ +[0-9]+ +[0-9.]+ |CUDA graph|rror" $OUT/run45-v2lite-$mode.txt | cut -c1-200
done
rm -rf /dev/shm/v2lite
bash kernels/bench/run19-v3-awq61.sh > /tmp/v3.txt 2>&1
mv $OUT/run19-bench.txt $OUT/run45-v3-awq61.txt
grep -E "gen|bench rc" /tmp/v3.txt
grep -E "^ +[0-9]+ +[0-9.]+ |CUDA graph|rror" $OUT/run45-v3-awq61.txt | cut -c1-220
