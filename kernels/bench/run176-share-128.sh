#!/bin/bash
# run 176 (one GPU): run 175's build; the 61-layer V3 share (AWQ g64, 64 routed experts a layer,
# context 2,048) at batch 128, about 16 rows an expert (its last tile of at most 8 rows a half
# tile), each step also replayed with the half tiles off and on at any size. Batch 256 needs about
# 131 GiB with its KV (run 118), over the bench's 90% of an H200.
# `timeout 400 bash kernels/bench/run176-share-128.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-176}
nvidia-smi --query-gpu=name --format=csv,noheader
SHARE_END=395 share_steps 128
share_profile "128"
