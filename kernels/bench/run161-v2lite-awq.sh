#!/bin/bash
# run 161 (one GPU): V2-Lite in AWQ (context 1,024) at batches 1, 16, 64 and 256 with this build
# (64-row dense AWQ GEMMs on wgmma) and the one before ($P, mma.sync), in the same run.
# `timeout 500 bash kernels/bench/run161-v2lite-awq.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-161}
$P kernels-check --quick --stages sample > /dev/null 2>&1 &
gen_model v2awq --shape v2-lite --dtype awq
wait
BENCH_TIMEOUT=120 ab_steps v2awq 1,16,64,256
for t in new prev; do echo "== $t"; grep -E "^ +(1|16|64|256) +[0-9.]+ |CUDA graph:" $OUT/run$R-v2awq-$t.txt | cut -c1-140; done
