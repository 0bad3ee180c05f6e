#!/bin/bash
# run 183 (one GPU): the session's final build (af2c37f) against run 178's ($P): the quick pass,
# V2-Lite bf16 and AWQ at batch 1 and four V3 layers in AWQ at batches 1, 2 and 4 with both builds,
# the 61-layer V3 share at batch 1 with this build.
# `timeout 500 bash kernels/bench/run183-final.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-183}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2bf --shape v2-lite; gen_model v2awq --shape v2-lite --dtype awq
  gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
quick_checks $R
grep -E "^mla_attention auto.*(V3 heads|one row)" $OUT/run$R-checks.txt | cut -c1-150 | head -4
wait
BENCH_TIMEOUT=40 ab_steps v2bf 1
BENCH_TIMEOUT=40 ab_steps v2awq 1
BENCH_TIMEOUT=40 ab_steps v3l4 1,2,4
SHARE_END=480 share_steps 1
grep -hE "profile decode batch 1:" $OUT/run$R-v3-61.txt | tr ',' '\n' | grep -E "kernels|mla_|cast" | tr '\n' ' '; echo
