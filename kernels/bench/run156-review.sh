#!/bin/bash
# run 156 (one GPU): the review's mend of v4 (the probabilities' shared-memory offsets through
# v4_off, as the loads' and the query's) against run 155's build ($P): the attention stage with v4
# named, four V3 layers in AWQ (64 experts) at batches 64 and 256 with both builds.
# `timeout 300 bash kernels/bench/run156-review.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-156}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
$P kernels-check --quick --stages sample > $OUT/run$R-prev-compile.txt 2>&1 &
attention_check v4 CLEAVE_MLA_DECODE=v4
wait
BENCH_TIMEOUT=60 ab_steps v3l4 64,256
for t in new prev; do echo "== $t"; grep -hE "profile decode batch (64|256):" $OUT/run$R-v3l4-$t.txt | grep -oE "(batch [0-9]+|mla_decode[0-9a-z_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' '; echo; done
