#!/bin/bash
# run 204 (one GPU): a timing probe, not a kernel: the persistent compressed GEMMs read their
# weights as if laid out k-tile-major (a k-tile's column groups contiguous, so that a block's
# stage is one 8 KB run instead of 32 runs of 256 bytes; results wrong, every time real), against
# the same build's own kernels: qgemm_tune's rows of the 8-row and 16-row shapes both ways, and 30
# V3 layers at batch 1. Asks whether the number of DRAM streams holds the one-row dense GEMMs.
# Then, with the same build, 30 V3 layers at batch 1 with every AWQ GEMM forced to 8x128/64/6
# (NOTES item 6: it beat 8x256/64/4 on the one-row q_a, q_b and o_proj in run 203's qgemm_tune).
# One build ($C, HEAD) and the probe's kernel source as a variant: on the development machine,
# `bash kernels/bench/variant.sh probe204 a3f2b2a` (commit a3f2b2a holds the probe: e2117e5
# rebased on the 6-stage wgmma instance, reverted in the source after it), then
# `timeout 300 bash kernels/bench/run204-layout-probe.sh` with .carry carried. Not run yet
# (sessions 38 and 39: no device time).
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-204}
V=CLEAVE_KERNEL_SOURCES=.carry/variants/probe204
nvidia-smi --query-gpu=name --format=csv,noheader
v3x30_gen
qgemm_tune_run tune-probe $V > /dev/null; echo "probe tune $(( $(date +%s) - S )) s"
grep -E "module qdecode" $OUT/run$R-tune-probe.txt
qgemm_tune_run tune-base > /dev/null; echo "base tune $(( $(date +%s) - S )) s"
echo "== qgemm_tune, one row and 16-token experts, AWQ g64: as laid out -> probe (us)"
for shp in "8x256/64/4" "8x128/64/6" "256/64/4"; do
  paste <(grep -E "^qgp awq g64 $shp +V3 .*(1 rows|share 16 tok).*(splits|stream-K)\)" $OUT/run$R-tune-base.txt) \
        <(grep -E "^qgp awq g64 $shp +V3 .*(1 rows|share 16 tok).*(splits|stream-K)\)" $OUT/run$R-tune-probe.txt) |
    awk -F'\t' '{split($1, a, "  +"); n = split($2, b, "  +"); print a[2] ": " a[5] " -> " b[5] " us (" a[6] " -> " b[6] " GB/s)"}' | cut -c1-150
done
V3X30_BATCHES=1 v3x30_steps v3x30-base
V3X30_BATCHES=1 v3x30_steps v3x30-probe $V
V3X30_BATCHES=1 v3x30_steps v3x30-8x128 CLEAVE_QGEMM=persistent:8x128/64/6
V3X30_BATCHES=1 v3x30_steps v3x30-base2
(cd $OUT && tar czf run$R.tgz run$R-*.txt && rm run$R-*.txt)
