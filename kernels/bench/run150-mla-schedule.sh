#!/bin/bash
# run 150 (one GPU): the seesaw v4 after run 149's stall sampling: its query loaded in two rounds
# of 9 chunks a thread (one chunk at a time had been 12% of its samples), warpgroup 0's copies of
# the next tile B issued before it can stall on the next tile A (warpgroup 1 waiting for them
# had been 15%), the next tile A's first copies before the scale barrier; against run 146's
# build ($P). The attention stage with v4 named, four V3 layers in AWQ (64 experts) at batches
# 1, 64 and 256 with both builds and the kernel's time in each profile.
# `timeout 300 bash kernels/bench/run150-mla-schedule.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-150}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
$P kernels-check --quick --stages sample > $OUT/run$R-prev-compile.txt 2>&1 &
attention_check v4 CLEAVE_MLA_DECODE=v4
wait
BENCH_TIMEOUT=60 ab_steps v3l4 1,64,256
for t in new prev; do echo "== $t"; grep -hE "profile decode batch (1|64|256):" $OUT/run$R-v3l4-$t.txt | grep -oE "(batch [0-9]+|mla_decode[0-9a-z_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' '; echo; done
