#!/bin/bash
# run 199 (one GPU): where the one-row dense AWQ GEMMs wait, and whether run 198's zero-point fold
# (commit 7c77159, carried as $C) ran fewer instructions. ncu on the 8-row AWQ kernel
# (qgp8_awq_256_64_4_f32) in two V3 layers' batch-1 steps (AWQ, 64 routed experts, dummy weights,
# context 2,048): per-launch time, DRAM bytes, issue, warps and instructions per byte with $P
# (the current source) and with $C (7c77159), then $P's stall reasons and memory sections.
# `timeout 400 bash kernels/bench/run199-ncu-dense.sh [RUN]`, with the same two binaries as run 200, so
# both can share one call: `bash kernels/bench/run200-zero-fold-h200.sh; bash kernels/bench/run199-ncu-dense.sh`.
# First try (results/run199a-*): on 30 layers ncu's replays saved and restored most of the GPU's
# memory, so neither pass finished in 90 s.
# Ran on a84b4a3 ($P) and 7c77159 ($C), one H100, session 37: docs/benchmarks.md "Where the one-row
# dense AWQ GEMMs wait", results/run199.tgz.
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-199}
nvidia-smi --query-gpu=name --format=csv,noheader
$P gen-checkpoint --config-only --shape v3-layers --layers 2 --routed-experts 64 --dtype awq --out /dev/shm/v3x2 > /dev/null 2>&1
M=gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum
for b in $P $C; do
  t=$(basename $b)
  timeout 100 ncu --clock-control none -k regex:qgp8_awq_256_64_4_f32 --launch-skip 4 --launch-count 8 --metrics $M --csv \
    --print-units base $b kernels-check --no-ops --bench-model /dev/shm/v3x2 --load-format dummy \
    --ctx 2048 --batches 1 --prefill 0 > $OUT/run$R-metrics-$t.csv 2>&1
  echo "ncu metrics $t rc=$? $(( $(date +%s) - S )) s"
  ncu_launches $OUT/run$R-metrics-$t.csv
done
ST=$(echo long_scoreboard barrier lg_throttle math_pipe_throttle not_selected wait short_scoreboard mio_throttle no_instruction \
  branch_resolving dispatch_stall | tr ' ' '\n' | sed 's/.*/smsp__average_warps_issue_stalled_&_per_issue_active.ratio/' | paste -sd,)
timeout 120 ncu --clock-control none -k regex:qgp8_awq_256_64_4_f32 --launch-skip 4 --launch-count 4 --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats --section SpeedOfLight --print-details all --metrics $ST \
  $P kernels-check --no-ops --bench-model /dev/shm/v3x2 --load-format dummy --ctx 2048 --batches 1 --prefill 0 \
  > $OUT/run$R-details.txt 2>&1
echo "ncu sections rc=$? $(( $(date +%s) - S )) s"
grep -E "stalled|qgp8_awq|Duration|DRAM Throughput|Warp Cycles Per Issued|Eligible Warps|Issued Warp|No Eligible|Active Warps Per|L2 Hit|Mem Busy|Max Bandwidth" \
  $OUT/run$R-details.txt | sed 's/  */ /g' | head -80
