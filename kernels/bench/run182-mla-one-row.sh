#!/bin/bash
# run 182 (one GPU): below MLA4_MIN_ROWS (2) rows the default MLA decode kernel at 128 heads is v3
# with 16 heads a block instead of v4 (run 181: four V3 layers at batch 1 1.216 against 1.234 ms),
# with run 181's absorb changes. The quick pass (now with a one-row 128-head attention case against
# the CPU), four V3 layers in AWQ at batches 1, 2, 4, 8 with v4 and with v3:16 named, and with the
# default; the 61-layer V3 share at batch 1 (run 181: 11.890 ms with v4).
# `timeout 570 bash kernels/bench/run182-mla-one-row.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-182}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 &
quick_checks $R
grep -E "^mla_attention auto.*(few rows|V3 heads|one row)" $OUT/run$R-checks.txt | cut -c1-150 | head -5
wait
BENCH_TIMEOUT=45 bench_steps v3l4-v4 $C v3l4 1,2,4,8 CLEAVE_MLA_DECODE=v4
BENCH_TIMEOUT=45 bench_steps v3l4-v3h16 $C v3l4 1,2,4,8 CLEAVE_MLA_DECODE=v3:16
BENCH_TIMEOUT=30 bench_steps v3l4 $C v3l4 1
for x in v3l4-v4 v3l4-v3h16; do echo "== $x"; grep -hE "profile decode batch" $OUT/run$R-$x.txt | grep -oE "(batch [0-9]+|mla_decode[a-z0-9_]* [0-9.]+ms/[0-9]+|mla_combine [0-9.]+ms/[0-9]+)" | tr '\n' ' '; echo; done
SHARE_END=560 share_steps 1
grep -hE "profile decode batch 1:" $OUT/run$R-v3-61.txt | tr ',' '\n' | grep -E "kernels|absorb|cast|mla_" | tr '\n' ' '; echo
