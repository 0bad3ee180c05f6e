#!/bin/bash
# run 164 (one GPU): AWQ 16-row tiles on the tokens-as-N kernel (qgpn: the weights as the MMAs'
# 16-row operand, the tile's rows as two 8-token tiles, the second skipped by items of at most 8
# rows), the default for AWQ tiles of 16 rows in this build ($P: the tokens-as-A qgp 256/64/4).
# qgemm_tune (every shape against the tiled kernel, 1e-3), the quick pass, four V3 layers (64
# experts: 8 rows an expert at batch 64) and V2-Lite in AWQ with both builds, then the 61-layer V3
# share at batches 1 and 64.
# `timeout 570 bash kernels/bench/run164-tokens-n16.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-164}
nvidia-smi --query-gpu=name --format=csv,noheader
awq_models_gen
$P kernels-check --quick --stages sample > /dev/null 2>&1 &
qgemm_tune_run tune-full
# (The build printed the two-token-tile shapes as n256/64/4 and n128/64/4.)
echo "== experts, stream-K: tokens-as-A 256/64/4, tokens-as-N 8x256/64/4, two 8-token tiles n256/64/4 and n128/64/4"
tune_experts "256/64/4|8x256/64/4|n256/64/4|n128/64/4"
echo "== dense 16 rows, g64"
grep -E "^qgp awq g64 (256/64/4|128/64/4|n256/64/4|n128/64/4) .* 16 rows" $OUT/run$R-tune-full.txt | cut -c1-150
quick_checks $R
wait
awq_models_ab
SHARE_END=560 share_steps 1,64
grep -E "profile decode batch (1|64):" $OUT/run$R-v3-61.txt | grep -oE "(batch [0-9]+|kernels [0-9.]+ ms|qg[a-z0-9_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' ' | cut -c1-600; echo
