#!/bin/bash
# run 159 (one GPU): the 64-row dense AWQ GEMMs on warpgroup MMAs (wg64x64/64/4, the default on
# sm_90a): the quick pass (golden fixtures, tiny-r1, tiny-r1-awq, graphs against eager), then the
# real model's one-GPU share (61 V3 layers in AWQ, 64 routed experts a layer, context 2,048) at
# batches 1 and 64.
# `timeout 560 bash kernels/bench/run159-final.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-159}
nvidia-smi --query-gpu=name --format=csv,noheader
quick_checks $R
SHARE_END=550 share_steps 1,64
grep -E "profile decode batch (1|64):" $OUT/run$R-v3-61.txt | cut -c1-400
