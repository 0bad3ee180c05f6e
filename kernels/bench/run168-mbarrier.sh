#!/bin/bash
# run 168 (one GPU): the compressed decode GEMMs' stages on mbarriers (full: the threads' cp.asyncs
# arrive; empty: each warp arrives when done, and a stage is refilled once all four have) instead
# of one __syncthreads per k-tile, against the build before ($P). qgemm_tune with both builds
# (every shape against the tiled kernel, 1e-3), the quick pass, four V3 layers and V2-Lite in AWQ.
# `timeout 570 bash kernels/bench/run168-mbarrier.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-168}
nvidia-smi --query-gpu=name --format=csv,noheader
kernel_ab
