#!/bin/bash
# run 179 (one GPU): the 64-row AWQ wgmma GEMM (qgw64) with each weight unpacked times its scale
# (rounded to bf16, as Marlin) so that its MMAs accumulate every k-tile with no per-group fold,
# against run 178's build ($P): qgemm_tune with both builds (the dense 64-row cases), the quick
# pass (golden fixtures at float32, graphs against eager), four V3 layers and V2-Lite in AWQ with
# both builds, then the 61-layer V3 share at batch 64 (run 175: 48.488 ms) with this build.
# `timeout 570 bash kernels/bench/run179-wg-scaled.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-179}
nvidia-smi --query-gpu=name --format=csv,noheader
awq_models_gen
tune_ab_run
grep -E "^qgp awq g(64|128) wg64x64/64/4 +V3 .* 64 rows" $OUT/run$R-tune-full.txt | cut -c1-150 | head -8
quick_checks $R
wait
BENCH_TIMEOUT=50 ab_steps v3l4 1,64
BENCH_TIMEOUT=50 ab_steps v2awq 64,256
for m in v3l4 v2awq; do for t in new prev; do
  echo "== $m $t"
  grep -hE "profile decode batch (64|256):" $OUT/run$R-$m-$t.txt | grep -oE "(batch [0-9]+|kernels [0-9.]+ ms|qgw[a-z0-9_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' ' | cut -c1-300; echo
done; done
SHARE_END=560 share_steps 64
share_profile "64"
