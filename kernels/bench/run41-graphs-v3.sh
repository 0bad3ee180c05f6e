#!/bin/bash
# run 41 (one GPU): the 32-row threshold (avg 16 rows per expert) and shapes on bf16 V2-Lite at
# batch 128/256, then the real model's share (61 V3 layers in AWQ, 64 routed experts per layer,
# run 19's script) at batch 1/64/128, eager and replayed from CUDA graphs.
source kernels/bench/lib.sh
$C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1
timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 128,256 --prefill 0 > $OUT/run41-v2lite.txt 2>&1
echo "bench rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ |CUDA graph|32-row|rror" $OUT/run41-v2lite.txt | cut -c1-220
rm -rf /dev/shm/v2lite
bash kernels/bench/run19-v3-awq61.sh > /tmp/v3.txt 2>&1
mv $OUT/run19-bench.txt $OUT/run41-v3-awq61.txt
grep -E "gen|bench rc" /tmp/v3.txt
grep -E "^ +[0-9]+ +[0-9.]+ |CUDA graph|rror" $OUT/run41-v3-awq61.txt | cut -c1-220
