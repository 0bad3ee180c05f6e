#!/bin/bash
# run 173 (one GPU): the 8-row AWQ kernel qgp8_awq_256_64_4 at four blocks an SM
# (__launch_bounds__(128, 4): 128 registers, 8-16 bytes of spill) against run 172's build ($P):
# qgemm_tune with both builds, four V3 layers and V2-Lite in AWQ.
# `timeout 400 bash kernels/bench/run173-qgp8-4blocks.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-173}
nvidia-smi --query-gpu=name --format=csv,noheader
awq_models_gen
tune_ab_run | grep -vE "^(awq g128|fp8) "
wait
awq_models_ab
