#!/bin/bash
# run 205 (one GPU): the 64-row AWQ wgmma GEMM taking an item's k-tiles two at a time (commit
# 0204e89, reverted in the source: the first k-tile's partial sums folded while the second's
# MMAs run, one wait for MMAs exposed per two k-tiles; 199/233 registers, so two blocks an SM
# where the default runs three), as a kernel variant of one build ($C, HEAD), against the
# build's own kernel: qgemm_tune (every compiled shape against the tiled kernel within 1e-3, so
# the variant's results are checked there) and 30 V3 layers at batch 64, with the default 4-stage
# shape and with the 6-stage one (wg64x64/64/6, compiled since session 39) forced. On the
# development machine: `bash kernels/bench/variant.sh wgpair 0204e89`, then
# `timeout 300 bash kernels/bench/run205-wg-pairs.sh` with .carry carried (after run 204 in the
# same call, its base qgemm_tune is reused). Not run yet (session 39: no device time).
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-205}
V=CLEAVE_KERNEL_SOURCES=.carry/variants/wgpair
nvidia-smi --query-gpu=name --format=csv,noheader
[ -f /dev/shm/v3x30/config.json ] || v3x30_gen
qgemm_tune_run tune-pairs $V
grep -E "module qdecode" $OUT/run$R-tune-pairs.txt
base=$OUT/run204-tune-base.txt
[ -f $base ] || { qgemm_tune_run tune-base > /dev/null; base=$OUT/run$R-tune-base.txt; }
echo "== qgemm_tune, 64 rows, AWQ: default -> pairs (us)"
for shp in "wg64x64/64/4" "wg64x64/64/6"; do
  paste <(grep -E "^qgp awq g(64|128) $shp .* 64 rows" $base) <(grep -E "^qgp awq g(64|128) $shp .* 64 rows" $OUT/run$R-tune-pairs.txt) |
    awk -F'\t' '{split($1, a, "  +"); split($2, b, "  +"); print a[1] ": " a[4] " -> " b[4] " us, err " a[2] " -> " b[2]}' | cut -c1-160
done
for b in base pairs; do
  env=""; [ $b = pairs ] && env=$V
  V3X30_BATCHES=64 v3x30_steps v3x30-$b-4 $env
  V3X30_BATCHES=64 v3x30_steps v3x30-$b-6 $env CLEAVE_QGEMM=persistent:wg64x64/64/6
done
grep -hE "profile decode batch 64:" $OUT/run$R-v3x30-*.txt | grep -oE "(batch [0-9]+|kernels [0-9.]+ ms|qgw[a-z0-9_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' '; echo
(cd $OUT && tar czf run$R.tgz run$R-*.txt && rm run$R-*.txt)
