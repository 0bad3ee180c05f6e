#!/bin/bash
# run 204 (one GPU): a timing probe, not a kernel: the persistent compressed GEMMs read their
# weights as if laid out k-tile-major (a k-tile's column groups contiguous, so that a block's
# stage is one 8 KB run instead of 32 runs of 256 bytes; results wrong, every time real) as $C,
# against the build before ($P): qgemm_tune's rows of the 8-row and 16-row shapes with both
# builds, and 30 V3 layers at batch 1. Asks whether the number of DRAM streams holds the
# one-row dense GEMMs. `timeout 180 bash kernels/bench/run204-layout-probe.sh` with the probe
# (commit e2117e5, reverted in the source after the build) built as .carry/cleave.gz and the
# source before it (fabaf5f) as .carry/cleave-prev.gz. Not run yet (session 38: no device time).
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-204}
nvidia-smi --query-gpu=name --format=csv,noheader
v3x30_gen
qgemm_tune_run tune-probe > /dev/null; echo "probe tune $(( $(date +%s) - S )) s"
qgemm_tune_run tune-prev $P > /dev/null
echo "== qgemm_tune, one row and 16-token experts, AWQ g64: before -> probe (us)"
for shp in "8x256/64/4" "8x128/64/6" "256/64/4"; do
  paste <(grep -E "^qgp awq g64 $shp +V3 .*(1 rows|share 16 tok).*(splits|stream-K)\)" $OUT/run$R-tune-prev.txt) \
        <(grep -E "^qgp awq g64 $shp +V3 .*(1 rows|share 16 tok).*(splits|stream-K)\)" $OUT/run$R-tune-probe.txt) |
    awk -F'\t' '{split($1, a, "  +"); n = split($2, b, "  +"); print a[2] ": " a[5] " -> " b[5] " us (" a[6] " -> " b[6] " GB/s)"}' | cut -c1-150
done
v3x30_ab 1
(cd $OUT && tar czf run$R.tgz run$R-*.txt && rm run$R-*.txt)
