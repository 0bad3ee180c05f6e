#!/bin/bash
# run 172 (one GPU): the session's final build (run 170's kernels, qgp_fp8_32_128_8_silu at three
# blocks an SM, lds_words in common.cuh) against the build before run 169 ($P): qgemm_tune with
# both builds (every shape against the tiled kernel, 1e-3), the quick pass, four V3 layers and
# V2-Lite in AWQ.
# `timeout 500 bash kernels/bench/run172-final.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-172}
nvidia-smi --query-gpu=name --format=csv,noheader
kernel_ab
