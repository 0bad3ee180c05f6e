#!/bin/bash
# run 170 (one GPU): as run 169, with the 256-column shapes' weight chunks in runs of 8 a group (two groups a
# thread), so that a warp's copy meets every shared-memory bank once; run 169's loader otherwise: the zero
# points and scales read in 16- and 4-byte loads; against the build before ($P). qgemm_tune with both builds
# (every shape against the tiled kernel, 1e-3), the quick pass, four V3 layers and V2-Lite in AWQ, then the
# 61-layer V3 share at batches 1 and 64 with this build.
# `timeout 570 bash kernels/bench/run170-loader-banks.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-170}
nvidia-smi --query-gpu=name --format=csv,noheader
awq_models_gen
qgemm_tune_run tune-full
qgemm_tune_run tune-prev $P
echo "== qgemm_tune, best persistent shape per case: before -> this build"
tune_ab tune-full tune-prev
quick_checks $R
wait
awq_models_ab
SHARE_END=560 share_steps 1,64
grep -E "profile decode batch (1|64):" $OUT/run$R-v3-61.txt | grep -oE "(batch [0-9]+|kernels [0-9.]+ ms|qg[a-z0-9_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' ' | cut -c1-600; echo
