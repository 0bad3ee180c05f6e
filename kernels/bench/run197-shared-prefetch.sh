#!/bin/bash
# run 197 (one GPU): compressed expert GEMMs prefetch the folded shared experts' weights into L2
# before their PDL wait, while the routing runs (`CLEAVE_SHARED_PREFETCH=on|off`, default on),
# same binary: the quant stage and tiny-r1-awq first (graphs against eager), then V2-Lite AWQ and
# 30 V3 layers in AWQ (64 routed experts, dummy weights) at batch 1-2, on and off.
# `timeout 250 bash kernels/bench/run197-shared-prefetch.sh [RUN]`
# Not run yet (the session's device time ran out): the code is commit 5254242, reverted (82d9720)
# until measured: `git cherry-pick 5254242`, build, carry, then run this.
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-197}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v2awq --shape v2-lite --dtype awq &
$C gen-checkpoint --config-only --shape v3-layers --layers 30 --routed-experts 64 --dtype awq --out /dev/shm/v3x30 > /dev/null 2>&1
timeout 200 $C kernels-check --quick --stages quant --compare-model models/tiny-r1-awq > $OUT/run$R-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-checks.txt)"
grep -iE "fail|panic|graphs vs eager|over tol" $OUT/run$R-checks.txt | cut -c1-160 | head -6
v3x30_steps v3x30-on
v3x30_steps v3x30-off CLEAVE_SHARED_PREFETCH=off
BENCH_TIMEOUT=40 bench_steps v2awq-on $C v2awq 1,2
BENCH_TIMEOUT=40 bench_steps v2awq-off $C v2awq 1,2 CLEAVE_SHARED_PREFETCH=off
