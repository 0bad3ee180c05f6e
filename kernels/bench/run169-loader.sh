#!/bin/bash
# run 169 (one GPU): the compressed decode GEMMs with fewer instructions per k-tile: a thread's weight
# chunks in one 8-column group (one source pointer and flag, the offsets immediates), the zero
# points and scales read in 16- and 4-byte loads; against the build before ($P). qgemm_tune with both builds
# (every shape against the tiled kernel, 1e-3), the quick pass, four V3 layers and V2-Lite in AWQ, then the
# 61-layer V3 share at batches 1 and 64 with this build.
# `timeout 570 bash kernels/bench/run169-loader.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-169}
nvidia-smi --query-gpu=name --format=csv,noheader
kernel_ab
SHARE_END=560 share_steps 1,64
share_profile "1|64"
