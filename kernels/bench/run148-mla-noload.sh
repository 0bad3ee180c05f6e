#!/bin/bash
# run 148 (one GPU), a diagnostic: the seesaw v4 (this build, $C) against a build of it that
# copies no keys after the first pair (.carry/cleave-noload: every later pair's scores and
# products run on the first pair's buffers, its results wrong), in four V3 layers in AWQ at
# batches 64 and 256: how much of the kernel's time is waiting for the keys.
# `timeout 300 bash kernels/bench/run148-mla-noload.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-148}
N=.carry/cleave-noload; chmod +x $N
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
$N kernels-check --quick --stages sample > $OUT/run$R-noload-compile.txt 2>&1 &
$C kernels-check --quick --stages sample > $OUT/run$R-compile.txt 2>&1
wait
BENCH_TIMEOUT=60 bench_steps v3l4 $C v3l4 64,256
BENCH_TIMEOUT=60 bench_steps v3l4-noload $N v3l4 64,256
for t in v3l4 v3l4-noload; do echo "== $t"; grep -hE "profile decode batch (64|256)" $OUT/run$R-$t.txt | grep -oE "(batch [0-9]+|mla_decode[0-9a-z_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' '; echo; done
