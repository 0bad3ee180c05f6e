#!/bin/bash
# run 173 (one GPU): the 8-row AWQ kernel qgp8_awq_256_64_4 at four blocks an SM
# (__launch_bounds__(128, 4): 128 registers, 8-16 bytes of spill) against run 172's build ($P):
# qgemm_tune with both builds, four V3 layers and V2-Lite in AWQ.
# `timeout 400 bash kernels/bench/run173-qgp8-4blocks.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-173}
nvidia-smi --query-gpu=name --format=csv,noheader
awq_models_gen
qgemm_tune_run tune-full
qgemm_tune_run tune-prev $P
echo "== qgemm_tune, best persistent shape per case: before -> this build"
tune_ab tune-full tune-prev | grep -E "^awq g64"
wait
awq_models_ab
