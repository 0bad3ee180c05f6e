#!/bin/bash
# run 13 (one GPU): every parallel layout and the TP2 -> DP2+EP handoff through the host (the
# path of transfers between GPU groups) on the CUDA kernels, for three checkpoints.
source kernels/bench/lib.sh
for m in models/golden/bf16-qlora models/golden/f32-noqlora models/tiny-r1; do
  echo "== $m"
  timeout 200 $C kernels-check --no-ops --parallel-model $m 2>&1 | grep -E "^  [a-z]|tie|DIFF|rror|within|failed" | grep -v "module\|mla_decode"
done
