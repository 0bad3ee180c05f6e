#!/bin/bash
# run 143 (one GPU): the AWQ expert GEMMs at 8 rows an expert (batch 64 over 64 experts, top-8),
# the largest part of the 61-layer share's step at batch 64 (run 142: gate/up 21.5 ms and down
# 11.5 ms of 58.6): the compiled persistent shapes tried on four V3 layers in AWQ (64 experts) at
# batch 64, with the 8-row tiles (CLEAVE_QGEMM_ROWS8=8) and forced 16-row shapes
# (CLEAVE_QGEMM=persistent:16xBN/BK/STAGES, which the dense GEMMs take too: read the expert
# kernels' lines of the profile). This build is run 141's (v4 attention).
# `timeout 400 bash kernels/bench/run143-qgp-experts.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-143}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64
for cfg in default rows8 16x128/64/6 16x128/64/8 16x128/128/4 16x64/64/8 16x64/128/6 default; do
  case $cfg in
    default) envs=(X=1) ;;
    rows8) envs=(CLEAVE_QGEMM_ROWS8=8) ;;
    *) envs=(CLEAVE_QGEMM=persistent:$cfg) ;;
  esac
  BENCH_TIMEOUT=90 bench_steps v3l4-${cfg//\//-} $C v3l4 1,64 "${envs[@]}"
  grep -oE "qgp[0-9]*_awq_[0-9_]+_(silu|f32) [0-9.]+ms/1," $OUT/run$R-v3l4-${cfg//\//-}.txt | tr '\n' ' '; echo
done
