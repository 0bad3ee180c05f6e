#!/bin/bash
# run 162 (one GPU): the review's mends of qg_persistent (one word loader for the AWQ paths, the
# wgmma accumulators fenced by wg_fence_regs) against run 161's build ($P): qgemm_tune (every
# shape against the tiled kernel), the quick pass, four V3 layers in AWQ at batch 64 with both.
# `timeout 500 bash kernels/bench/run162-review.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-162}
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
$P kernels-check --quick --stages sample > /dev/null 2>&1 &
timeout 200 $C kernels-check --stages qgemm_tune > $OUT/run$R-tune-full.txt 2>&1
echo "tune rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-tune-full.txt)"
grep -iE "fail|panic|error" $OUT/run$R-tune-full.txt | head -5 | cut -c1-200
quick_checks $R
wait
BENCH_TIMEOUT=60 ab_steps v3l4 64
