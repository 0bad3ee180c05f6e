#!/bin/bash
# run 203 (one GPU): warp-private pipeline stages for the 8-row AWQ GEMMs on mma.sync (TokensN:
# each warp copies its own columns and its own token tile and waits with __syncwarp, no block
# barrier) as $C, with a 5-stage 256-column shape beside the 4-stage one, against the build
# before ($P): qgemm_tune with both builds, 30 V3 layers at batch 1 and 64, the quick pass, then
# V2-Lite in AWQ at batch 1 and 64 if time is left.
# `timeout 580 bash kernels/bench/run203-warp-stages.sh [RUN]` with the change built as
# .carry/cleave.gz and the source before it as .carry/cleave-prev.gz.
# Ran on bcb147c ($C) and a84b4a3 ($P), one H100, session 38: 3-6% slower everywhere, reverted
# (results/run203.tgz). To run it again, build bcb147c as .carry/cleave.gz.
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-203}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v2awq --shape v2-lite --dtype awq &
v3x30_gen
tune_ab_run | grep -vE "^(awq g128|fp8) "
v3x30_ab 1,64
quick_checks $R
wait
[ "$(( $(date +%s) - S ))" -lt 470 ] && BENCH_TIMEOUT=40 ab_steps v2awq 1,64
(cd $OUT && tar czf run$R.tgz run$R-*.txt && rm run$R-*.txt)
