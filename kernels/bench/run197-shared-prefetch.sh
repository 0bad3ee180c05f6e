#!/bin/bash
# run 197 (one GPU): compressed expert GEMMs prefetch the folded shared experts' weights into L2
# before their PDL wait, while the routing runs (`CLEAVE_SHARED_PREFETCH=on|off`, default on),
# same binary: the quant stage and tiny-r1-awq first (graphs against eager), then V2-Lite AWQ and
# 30 V3 layers in AWQ (64 routed experts, dummy weights) at batch 1-2, on and off.
# `timeout 250 bash kernels/bench/run197-shared-prefetch.sh [RUN]`
# Ran on commit 5254242 (one H100; reverted in 82d9720, stays so: docs/benchmarks.md). To run it
# again: `git cherry-pick 5254242`, build, carry, then this.
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-197}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v2awq --shape v2-lite --dtype awq &
v3x30_gen
timeout 200 $C kernels-check --quick --stages quant --compare-model models/tiny-r1-awq > $OUT/run$R-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-checks.txt)"
grep -iE "fail|panic|graphs vs eager|over tol" $OUT/run$R-checks.txt | cut -c1-160 | head -6
v3x30_steps v3x30-on
v3x30_steps v3x30-off CLEAVE_SHARED_PREFETCH=off
BENCH_TIMEOUT=40 bench_steps v2awq-on $C v2awq 1,2
BENCH_TIMEOUT=40 bench_steps v2awq-off $C v2awq 1,2 CLEAVE_SHARED_PREFETCH=off
