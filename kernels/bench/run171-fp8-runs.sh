#!/bin/bash
# run 171 (one GPU): run 170's build with the FP8 shapes' weight chunks back in runs of a group's
# whole k-tile (L = UCH, the mapping before run 169), against the build before run 169 ($P):
# qgemm_tune with both builds (every shape against the tiled kernel, 1e-3), the quick pass, four V3
# layers and V2-Lite in AWQ.
# `timeout 500 bash kernels/bench/run171-fp8-runs.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-171}
nvidia-smi --query-gpu=name --format=csv,noheader
kernel_ab
