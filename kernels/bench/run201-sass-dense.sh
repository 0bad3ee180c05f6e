#!/bin/bash
# run 201 (one GPU): which SASS instructions the one-row dense AWQ GEMM (qgp8_awq_256_64_4_f32)
# waits on, after run 199 found its stalls spread over wait, barrier, long scoreboard and math
# pipe with 2.7 warps a scheduler. ncu's source counters on two launches of two V3 layers' batch-1
# step (AWQ, 64 routed experts, dummy weights, context 2,048): the 71 MB one (launch 4 of
# run 199's list) and the 63 MB one (launch 7, o_proj), the 40 instructions with most stall
# samples each. `timeout 200 bash kernels/bench/run201-sass-dense.sh [RUN]` with the current
# source as .carry/cleave-prev.gz.
# Ran on a84b4a3, one H100, session 37: results/run201-sass-*.txt.
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-201}
nvidia-smi --query-gpu=name --format=csv,noheader
[ -d /dev/shm/v3x2 ] || $P gen-checkpoint --config-only --shape v3-layers --layers 2 --routed-experts 64 --dtype awq --out /dev/shm/v3x2 > /dev/null 2>&1
for skip in 4 7; do
  timeout 80 ncu --clock-control none -k regex:qgp8_awq_256_64_4_f32 --launch-skip $skip --launch-count 1 \
    --section SourceCounters --import-source no -f -o /tmp/run$R-$skip $P kernels-check --no-ops \
    --bench-model /dev/shm/v3x2 --load-format dummy --ctx 2048 --batches 1 --prefill 0 > $OUT/run$R-ncu-$skip.txt 2>&1
  echo "ncu skip $skip rc=$? $(( $(date +%s) - S )) s"
  sass_top /tmp/run$R-$skip $OUT/run$R-sass-$skip.txt
  head -24 $OUT/run$R-sass-$skip.txt
done
