#!/bin/bash
# run 194 (one GPU): V2-Lite AWQ decode steps at batch 1-2 with programmatic dependent launch as
# by default (`light`), off, and on every launch (`all`), same binary: does PDL's placement
# explain runs 192-193's one-row AWQ gain (kernels/NOTES.md)?
# `timeout 100 bash kernels/bench/run194-v2awq-pdl.sh [RUN]`
# Ran on commit 7cecb17 with CLEAVE_SHARED_BESIDE=off exported (that build's default otherwise
# moved V2-Lite's shared experts to a side stream; with it off the step is HEAD's).
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-194}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v2awq --shape v2-lite --dtype awq
BENCH_TIMEOUT=40 bench_steps v2awq-light $C v2awq 1,2
BENCH_TIMEOUT=20 bench_steps v2awq-off $C v2awq 1,2 CLEAVE_PDL=off
BENCH_TIMEOUT=20 bench_steps v2awq-all $C v2awq 1,2 CLEAVE_PDL=all
for t in v2awq-light v2awq-off v2awq-all; do
  echo "$t b1: $(grep -hE 'profile decode batch 1:' $OUT/run$R-$t.txt | cut -c1-400)"
done
