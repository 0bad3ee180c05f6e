#!/bin/bash
# run 144 (one GPU): this session's final build (MLA decode v4 the default at 128 heads, v3/v4 on
# the head-groups-first grid) against the build it started from ($P, a68dc01): the quick pass,
# bf16 V2-Lite (v3 at 16 heads: the grid change only) and four V3 layers in AWQ at batches 1 and
# 64, then the 61-layer one-GPU share at 1 and 64 with this build.
# `timeout 560 bash kernels/bench/run144-final.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-144}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2lite --shape v2-lite; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
$P kernels-check --quick --stages sample > $OUT/run$R-prev-compile.txt 2>&1 &
timeout 120 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run$R-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-checks.txt)"
grep -iE "fail|panic|over tol" $OUT/run$R-checks.txt | cut -c1-160 | head -6
wait
ab_steps v2lite 1,64
ab_steps v3l4 1,64
SHARE_END=550 share_steps 1,64
grep -E "profile decode batch (1|64):" $OUT/run$R-v3-61.txt | cut -c1-300
