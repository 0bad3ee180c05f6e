#!/bin/bash
# run 196 (one GPU): V2-Lite bf16 at batch 1 with the shared experts on the side stream
# (`CLEAVE_SHARED_BESIDE`, default 4 in that build) and inside the routed GEMMs (`off`), twice
# each, alternating: is run 195's 1% at one row real?
# `timeout 150 bash kernels/bench/run196-beside-b1.sh [RUN]`
# Ran on commit 7cecb17 (the side-stream code, since reverted).
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-196}
gen_model v2bf --shape v2-lite
for i in 1 2; do
  BENCH_TIMEOUT=40 bench_steps v2bf-on$i $C v2bf 1
  BENCH_TIMEOUT=40 bench_steps v2bf-off$i $C v2bf 1 CLEAVE_SHARED_BESIDE=off
done
