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
kernel_ab
SHARE_END=560 share_steps 1,64
share_profile "1|64"
