#!/bin/bash
# run 166 (one GPU), a diagnostic: the AWQ expert gate/up GEMM of four V3 layers in AWQ (64
# experts, context 2,048) at batch 64 (8 rows an expert: the 16-row tokens-as-A qgp_awq_256_64_4,
# 66% of HBM in qgemm_tune) and at batch 16 (2 rows: the 8-row tokens-as-N qgp8_awq_256_64_4, 78%):
# ncu's speed-of-light, occupancy, warp states, pipe use and instruction counts, then warp-stall
# sampling per SASS instruction of the batch-64 kernel (the 40 instructions with most samples).
# `timeout 500 bash kernels/bench/run166-expert-ncu.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-166}
gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64
run_b() { echo "$C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches $1 --prefill 0"; }
SECTIONS="--section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats"
METRICS="--metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,sm__inst_executed.sum"
for cfg in "64 regex:qgp_awq_256_64_4" "16 regex:qgp8_awq_256_64_4"; do
  set -- $cfg
  timeout 120 ncu --profile-from-start off --clock-control none --kernel-name $2 --launch-count 1 $SECTIONS $METRICS \
    $(run_b $1) > $OUT/run$R-ncu-b$1.txt 2>&1
  echo "== batch $1 $2: ncu rc=$? $(( $(date +%s) - S )) s"
  grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Issue Slots|Issued Ipc|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Registers Per|hmma|pipe_alu|pipe_fma|pipe_lsu|hit_rate|bytes_read|inst_executed.sum|Achieved Occ|Block Limit Reg" $OUT/run$R-ncu-b$1.txt | cut -c1-110 | head -40
done
timeout 150 ncu --profile-from-start off --clock-control none --kernel-name regex:qgp_awq_256_64_4 --launch-count 1 \
  --section SourceCounters --section WarpStateStats -f -o /tmp/prof $(run_b 64) > $OUT/run$R-ncu-src-log.txt 2>&1
echo "ncu source rc=$? $(( $(date +%s) - S )) s"
sass_top /tmp/prof $OUT/run$R-sass-top.txt
cut -c1-150 $OUT/run$R-sass-top.txt
