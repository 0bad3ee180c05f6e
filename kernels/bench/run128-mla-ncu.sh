#!/bin/bash
# run 128 (one GPU): where the MLA decode kernel's time goes at short contexts. ncu's GPU time and
# DRAM bytes of mla_decode3_h16 and mla_combine inside an eager bf16 V2-Lite step at
# context x batch 1k x 1, 1k x 64, 1k x 256, 8k x 64 (the fit of time against tiles per block
# gives the fixed cost per launch), then the full sections of one mla_decode3_h16 launch at 1k x 64.
# `timeout 570 bash kernels/bench/run128-mla-ncu.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-128}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v2lite --shape v2-lite
echo "model $(( $(date +%s) - S )) s"
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active,launch__occupancy_limit_shared_mem
NCU="ncu --profile-from-start off --clock-control none --kernel-name regex:mla_|gemv|rms|moe_comb --metrics $M --csv --print-units base"
for cb in 1024x1 1024x64 1024x256 8192x64; do
  ctx=${cb%x*}; b=${cb#*x}
  timeout 150 $NCU $C kernels-check --no-ops --bench-model /dev/shm/v2lite --ctx $ctx --batches $b --prefill 0 > $OUT/run$R-ncu-$cb.csv 2>&1
  echo "ncu $cb rc=$? $(( $(date +%s) - S )) s $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run$R-ncu-$cb.csv)"
  python3 - $OUT/run$R-ncu-$cb.csv $cb <<'PY'
import csv, sys
from collections import defaultdict
rows = defaultdict(lambda: defaultdict(list))
for r in csv.DictReader([l for l in open(sys.argv[1]) if l.startswith('"')]):
    rows[(r["Kernel Name"].split("(")[0], r["ID"])][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
agg = defaultdict(lambda: defaultdict(list))
for (n, _), m in rows.items():
    for k, v in m.items(): agg[n][k].append(v)
for n, m in sorted(agg.items()):
    t = sum(m["gpu__time_duration.sum"]) / len(m["gpu__time_duration.sum"]) / 1e3
    rd = sum(m["dram__bytes_read.sum"]) / len(m["dram__bytes_read.sum"]) / 1e6
    wr = sum(m["dram__bytes_write.sum"]) / len(m["dram__bytes_write.sum"]) / 1e6
    g = m["launch__grid_size"][0]; occ = sum(m["sm__warps_active.avg.pct_of_peak_sustained_active"]) / len(m["launch__grid_size"])
    print(f"  {sys.argv[2]:9} {n:24} x{len(m['launch__grid_size']):3} {t:8.2f} us  rd {rd:7.2f} MB wr {wr:6.2f} MB  {rd/t/1e3 if t else 0:5.2f} TB/s  grid {g:6.0f} occ {occ:5.1f}% smem-limit {m['launch__occupancy_limit_shared_mem'][0]:.0f}")
PY
done
timeout 150 ncu --profile-from-start off --clock-control none --kernel-name mla_decode3_h16 --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
  $C kernels-check --no-ops --bench-model /dev/shm/v2lite --ctx 1024 --batches 64 --prefill 0 > $OUT/run$R-ncu-detail.txt 2>&1
echo "detail rc=$? $(( $(date +%s) - S )) s"
grep -E "Duration|Throughput|Occupancy|Stall|Warp Cycles|Registers|Block Limit|Waves|Eligible|Issued" $OUT/run$R-ncu-detail.txt | head -40
