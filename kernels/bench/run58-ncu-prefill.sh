#!/bin/bash
# run 58 (one GPU): why mla_prefill_flash runs at ~85 TFLOP/s on V2-Lite's 4096-token prefill.
# ncu over the prefill stage's launches of the kernel: first their times and grids, then the full
# sections for the launch of the 4096 x 4096 V2-Lite case (16 heads, grid 64 x 16).
source kernels/bench/lib.sh
S=$(date +%s)
timeout 200 $C kernels-check --stages prefill > $OUT/run58-prefill.txt 2>&1
echo "prefill stage rc=$? $(( $(date +%s) - S )) s"; grep -E "flash|mla_attention" $OUT/run58-prefill.txt | cut -c1-170
timeout 200 ncu -k mla_prefill_flash --metrics gpu__time_duration.sum,launch__grid_size --csv --print-units base \
  $C kernels-check --stages prefill > $OUT/run58-ncu-list.csv 2>&1
echo "list rc=$? $(( $(date +%s) - S )) s"
IDX=$(python3 - $OUT/run58-ncu-list.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; data = rows[1:]
ii, mi, vi = hdr.index("ID"), hdr.index("Metric Name"), hdr.index("Metric Value")
grid = {r[ii]: float(r[vi].replace(",", "")) for r in data if r[mi] == "launch__grid_size"}
dur = {r[ii]: float(r[vi].replace(",", "")) for r in data if r[mi] == "gpu__time_duration.sum"}
cands = [i for i in grid if grid[i] == 1024]
best = max(cands, key=lambda i: dur[i])
print(best)
PY
)
echo "launch $IDX"
timeout 200 ncu -k mla_prefill_flash --launch-skip $IDX --launch-count 1 --section SpeedOfLight --section Occupancy \
  --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section LaunchStats $C kernels-check --stages prefill > $OUT/run58-ncu-flash.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s"
grep -vE "^==PROF==|^ +-+$" $OUT/run58-ncu-flash.txt | grep -E "Duration|Throughput|Warp Cycles|Stall|Issued|Eligible|Occupancy|Registers|Shared|Active Warps|No Eligible|Pipe|Executed Ipc|L1|L2|DRAM|Block Limit" | head -60
