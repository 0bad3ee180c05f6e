#!/bin/bash
# run 188 (one GPU): the 61-layer V3 AWQ share (one GPU's, dummy weights) at batch 64 with the
# session's final build (MLA decode merging its own splits where it splits).
# `timeout 280 bash kernels/bench/run188-share-64.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-188}
nvidia-smi --query-gpu=name --format=csv,noheader
SHARE_END=270 share_steps 64
