#!/bin/bash
# run 40 (one GPU): 32-row expert tiles for the persistent grouped GEMM (issue 15 item 2, the
# batch-256 step). Checks: the experts stage (every variant against the CPU, 32-row tiles at
# 256 tokens over 64 experts), then the bf16 V2-Lite decode at batch 1/64/128/256, eager and
# replayed from CUDA graphs, with the 32-row shapes swept.
source kernels/bench/lib.sh
$C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1 &
GP=$!
timeout 200 $C kernels-check --stages experts > $OUT/run40-experts.txt 2>&1
echo "experts rc=$? $(tail -1 $OUT/run40-experts.txt)"; grep -E "moe_experts" $OUT/run40-experts.txt | cut -c1-150 | head -30
wait $GP
timeout 300 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,64,128,256 > $OUT/run40-v2lite.txt 2>&1
echo "bench rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ |CUDA graph|32-row|rror" $OUT/run40-v2lite.txt | cut -c1-220
grep -oE "profile decode batch [0-9]+: kernels [0-9.]+ ms: [^,]+, [^,]+, [^,]+, [^,]+" $OUT/run40-v2lite.txt
