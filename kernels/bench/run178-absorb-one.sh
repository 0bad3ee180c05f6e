#!/bin/bash
# run 178 (one GPU): run 177's absorbed projections at one row only, W_UK's kernel with every
# weight of a thread in flight before the PDL wait (one round trip after it), against run 175's
# build ($P): the quick pass, V2-Lite bf16 and AWQ at batches 1 and 4 with both builds, the
# 61-layer V3 share at batch 1 with this build (run 177: 12.010 ms, $P 12.081).
# `timeout 400 bash kernels/bench/run178-absorb-one.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-178}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2bf --shape v2-lite; gen_model v2awq --shape v2-lite --dtype awq ) &
quick_checks $R
grep -E "^mla_attention auto.*(few rows|V3 heads)" $OUT/run$R-checks.txt | cut -c1-150 | head -4
wait
BENCH_TIMEOUT=40 ab_steps v2bf 1,4
BENCH_TIMEOUT=40 ab_steps v2awq 1,4
for m in v2bf v2awq; do echo "== $m new"; grep -hE "profile decode batch 1:" $OUT/run$R-$m-new.txt | tr ',' '\n' | grep -E "kernels|absorb" | tr '\n' ' '; echo; done
SHARE_END=390 share_steps 1
grep -hE "profile decode batch 1:" $OUT/run$R-v3-61.txt | tr ',' '\n' | grep -E "kernels|absorb|batched" | tr '\n' ' '; echo
