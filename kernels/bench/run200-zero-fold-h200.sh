#!/bin/bash
# run 200 (one GPU, meant for an H200): run 198 again where the GEMMs are further from the HBM
# limit: the 8-row AWQ GEMMs with the zero point folded out of the unpacking (commit 7c77159, as
# $C) against the current source ($P): qgemm_tune with both builds (run 198 passed the quick pass
# with this build), then 30 V3 layers and V2-Lite in AWQ at batch 1 and 64.
# `timeout 560 bash kernels/bench/run200-zero-fold-h200.sh [RUN]`
# Not run yet: session 36's tries got no machine three times, and the one H200 that came was
# taken back before the call finished. Build 7c77159 as .carry/cleave.gz and the current source
# as .carry/cleave-prev.gz, then run it (about 300 s).
# Ran on a84b4a3 ($P) and 7c77159 ($C), session 37, but on an H100 (no H200 came): results/run200.tgz.
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-200}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v2awq --shape v2-lite --dtype awq &
v3x30_gen
tune_ab_run | grep -vE "^(awq g128|fp8) "
wait
v3x30_ab 1,64
[ "$(( $(date +%s) - S ))" -lt 250 ] && BENCH_TIMEOUT=40 ab_steps v2awq 1,64
(cd $OUT && tar czf run$R.tgz run$R-*.txt && rm run$R-*.txt)
