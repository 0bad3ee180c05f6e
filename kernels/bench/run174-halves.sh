#!/bin/bash
# run 174 (one GPU): half tiles. With 16-row AWQ expert tiles, moe_align puts each expert's last
# tile of at most 8 rows in a second list, which the 8-row kernel runs in a launch of its own.
# qgemm_tune (the two launches against each single shape, every one against the tiled kernel),
# kernels-check's router and quant stages (moe_align with half tiles against the host reference;
# experts with and without them against the CPU and each other), the quick pass, four V3 layers
# and V2-Lite in AWQ, then the 61-layer V3 share at batches 1 and 64; each step is also replayed
# with the half tiles off (CLEAVE_QGEMM_HALVES's toggle inside the same process).
# `timeout 570 bash kernels/bench/run174-halves.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-174}
nvidia-smi --query-gpu=name --format=csv,noheader
awq_models_gen
qgemm_tune_run tune-full
echo "== AWQ expert cases: 16-row, 8-row and the two launches (stream-K)"
grep -E "^qgp awq g64 +(256/64/4|8x256/64/4|256/64/4\+8x256/64/4) .* tok, .*stream-K" $OUT/run$R-tune-full.txt | awk '{printf "%-22s %-70s %8s us %s\n", $4, substr($0, 27, 70), $(NF-4), $(NF-1)}'
timeout 150 $C kernels-check --stages router,quant > $OUT/run$R-router-quant.txt 2>&1
echo "router+quant rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-router-quant.txt)"
grep -iE "fail|panic|over tol|error" $OUT/run$R-router-quant.txt | head -5 | cut -c1-200
grep -E "half" $OUT/run$R-router-quant.txt | cut -c1-200 | head -30
quick_checks $R
wait
BENCH_TIMEOUT=60 bench_steps v3l4 $C v3l4 1,16,64
BENCH_TIMEOUT=60 bench_steps v2awq $C v2awq 1,16,64,256
grep -hE "CUDA graph" $OUT/run$R-v3l4.txt $OUT/run$R-v2awq.txt | cut -c1-150
SHARE_END=565 share_steps 1,64
share_profile "1|64"
