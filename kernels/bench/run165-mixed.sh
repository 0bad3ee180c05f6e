#!/bin/bash
# run 165 (one GPU): AWQ 16-row tiles on the mixed kernel (qgpm: items of more than 8 rows on the
# tokens-as-A body, items of at most 8 on the tokens-as-N one, half the MMAs and folds), the
# default for AWQ tiles of 16 rows in this build ($P: the tokens-as-A qgp 256/64/4 for all).
# qgemm_tune (every shape against the tiled kernel, 1e-3), the quick pass, four V3 layers (64
# experts: 8 rows an expert at batch 64) and V2-Lite in AWQ with both builds, then the 61-layer V3
# share at batches 1 and 64.
# `timeout 570 bash kernels/bench/run165-mixed.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-165}
nvidia-smi --query-gpu=name --format=csv,noheader
awq_models_gen
$P kernels-check --quick --stages sample > /dev/null 2>&1 &
qgemm_tune_run tune-full
echo "== experts, stream-K: tokens-as-A 256/64/4, tokens-as-N 8x256/64/4, mixed m256/64/4 and m128/64/4"
tune_experts "256/64/4|8x256/64/4|m256/64/4|m128/64/4"
echo "== the fastest per case"
grep -E "^  awq g(64|128) .* (16 rows|tok)" $OUT/run$R-tune-full.txt | cut -c1-170
quick_checks $R
wait
awq_models_ab
SHARE_END=560 share_steps 1,64
grep -E "profile decode batch (1|64):" $OUT/run$R-v3-61.txt | grep -oE "(batch [0-9]+|kernels [0-9.]+ ms|qg[a-z0-9_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' ' | cut -c1-600; echo
