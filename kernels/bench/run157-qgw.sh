#!/bin/bash
# run 157 (one GPU): the AWQ decode GEMM on warpgroup MMAs (qgw: the weights unpacked in registers
# as wgmma's 64-row A operand, the tile's 16 or 64 tokens as N from shared memory). qgemm_tune
# checks every shape against the tiled kernel (1e-3) at the V2-Lite and V3 expert and dense
# shapes; then four V3 layers in AWQ (64 experts) at batches 16 and 64 with this build (64-row
# dense GEMMs on wg64x64/64/4 by default) and the one before ($P, qgp64 64x64/64/4).
# `timeout 570 bash kernels/bench/run157-qgw.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-157}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
$P kernels-check --quick --stages sample > $OUT/run$R-prev-compile.txt 2>&1 &
timeout 300 $C kernels-check --stages qgemm_tune > $OUT/run$R-tune-full.txt 2>&1
echo "tune rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-tune-full.txt)"
grep -iE "fail|panic|over tol|error" $OUT/run$R-tune-full.txt | head -5 | cut -c1-200
grep -E "^  awq g64 (V3|V2-Lite)" $OUT/run$R-tune-full.txt | cut -c1-190
grep -E "^qgp awq g64 wg" $OUT/run$R-tune-full.txt | grep -E "V3 (o_proj|q_b|mlp down) 64|V3 64 tok" | cut -c1-170
wait
BENCH_TIMEOUT=60 ab_steps v3l4 16,64
for t in new prev; do echo "== $t"; grep -hE "profile decode batch (16|64):" $OUT/run$R-v3l4-$t.txt | grep -oE "(batch [0-9]+|kernels [0-9.]+ ms|qg[pw]64[a-z0-9_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' '; echo; done
