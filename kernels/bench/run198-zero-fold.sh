#!/bin/bash
# run 198 (one GPU): the 8-row AWQ decode GEMMs (qgp8_awq_*) with the zero point folded out of the
# unpacking (weights as 128 + q, the fold subtracting (128 + z) times the tokens' k-tile sums from
# two more MMAs a unit) against the build before ($P): the quick pass, qgemm_tune with both builds,
# then V2-Lite AWQ and 30 V3 layers in AWQ (64 routed experts, dummy weights) at batch 1 and 64.
# `timeout 560 bash kernels/bench/run198-zero-fold.sh [RUN]`
# Ran on commit 7c77159 (one H100), reverted after: no gain (docs/benchmarks.md). Its lines
# since written with lib.sh's v3x30_gen and v3x30_ab, the same commands.
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-198}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v2awq --shape v2-lite --dtype awq &
v3x30_gen
quick_checks $R
tune_ab_run | grep -vE "^(awq g128|fp8) "
wait
v3x30_ab 1,64
BENCH_TIMEOUT=40 ab_steps v2awq 1,64
cd $OUT && tar czf run$R.tgz run$R-*.txt && rm run$R-*.txt
