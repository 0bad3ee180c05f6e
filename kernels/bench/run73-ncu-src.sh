#!/bin/bash
# run 73 (one GPU): run 72's kernel with per-instruction stall sampling (ncu SourceCounters,
# SASS page as CSV) and the warp-state breakdown, to see where the producer and consumers wait.
source kernels/bench/lib.sh
S=$(date +%s)
$C gen-checkpoint --shape v3-layers --dtype fp8 --out /dev/shm/v3fp8 > /dev/null 2>&1
timeout 400 ncu -k regex:ggw_fp8_128x128_6_silu --launch-count 1 --section SourceCounters --section WarpStateStats \
  --metrics smsp__pcsamp_sample_count -o $OUT/run73 -f $C kernels-check --no-ops --bench-model /dev/shm/v3fp8 --batches 1 --prefill 4096 > $OUT/run73-log.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s"
ncu -i $OUT/run73.ncu-rep --page source --csv --print-source sass > $OUT/run73-sass.csv 2>&1  # summarized in results/run73-stalls.txt
echo "sass rc=$? lines $(wc -l < $OUT/run73-sass.csv)"
ncu -i $OUT/run73.ncu-rep --page details --print-details all > $OUT/run73-details.txt 2>&1
grep -iE "stall|Warp Cycles" $OUT/run73-details.txt | head -40
rm -rf /dev/shm/v3fp8 $OUT/run73.ncu-rep
