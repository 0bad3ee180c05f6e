#!/bin/bash
# run 137 (one GPU): the bf16 experts' persistent grouped GEMM shape at few tokens. bf16 V2-Lite
# decode steps (CUDA graphs, context 1,024) at batches 1, 4 and 16 with the default shape
# (BN 32, BK 64, 6 stages, prefetch 0) and the other compiled 16-row shapes through
# CLEAVE_MOE_GEMM=persistent:BN/BK/STAGES/PREFETCH (both expert GEMMs take it).
# `timeout 400 bash kernels/bench/run137-moe-shapes-b1.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-137}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v2lite --shape v2-lite &
BENCH_TIMEOUT=100 bench_steps v2lite-default $C v2lite 1,4,16
for cfg in 32/64/4/0 16/64/8/0 16/64/4/0 32/32/8/0 64/32/6/0 64/32/4/0 32/64/6/0; do
  BENCH_TIMEOUT=40 bench_steps v2lite-${cfg//\//-} $C v2lite 1,4,16 CLEAVE_MOE_GEMM=persistent:$cfg
done
BENCH_TIMEOUT=40 bench_steps v2lite-default2 $C v2lite 1,4,16
