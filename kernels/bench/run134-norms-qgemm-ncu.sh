#!/bin/bash
# run 134 (one GPU): the norms holding their weights in registers within a 1,024-thread launch's
# budget (NORM_W), against the build before ($P): the quick pass (with the MoE layer's end at
# 7,168 and 12,288 columns), bf16 V2-Lite and four V3 layers in AWQ. Then where the AWQ decode
# GEMMs' time goes at one row: ncu's time, DRAM bytes, instructions and issue activity of every
# qgp launch of an eager four-V3-layer step, and the full sections of two launches (o_proj and
# the dense MLP's gate/up).
# `timeout 570 bash kernels/bench/run134-norms-qgemm-ncu.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-134}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2lite --shape v2-lite; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
quick_checks $R
ab_steps v2lite 1,4,64
ab_steps v3l4 1,64
M=gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
timeout 120 ncu --profile-from-start off --clock-control none --kernel-name regex:qgp --launch-count 24 --metrics $M --csv --print-units base \
  $C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 1 --prefill 0 > $OUT/run$R-ncu.csv 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s"
ncu_launches $OUT/run$R-ncu.csv
timeout 150 ncu --profile-from-start off --clock-control none --kernel-name regex:qgp --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section InstructionStats --section ComputeWorkloadAnalysis \
  $C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 1 --prefill 0 > $OUT/run$R-ncu-detail.txt 2>&1
echo "detail rc=$? $(( $(date +%s) - S )) s"
grep -E "qgp|Duration|Throughput|Issue Slots|Issued Warp|No Eligible|Active Warps|Eligible Warps|Warp Cycles Per Issued|Registers|Achieved Occupancy|Executed Ipc" $OUT/run$R-ncu-detail.txt | cut -c1-120 | head -50
