#!/bin/bash
# run 160 (one GPU), a diagnostic: the 64-row AWQ wgmma GEMM (qgw64_awq_64_64_4) in four V3
# layers' step at batch 64 (AWQ, 64 experts, context 2,048): ncu's speed-of-light, occupancy,
# warp states and tensor-pipe use for three launches (the stacked q_a/kv_a, q_b and o_proj), then
# warp-stall sampling per SASS instruction for o_proj (the 40 instructions with most samples).
# `timeout 400 bash kernels/bench/run160-qgw-ncu.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-160}
gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64
RUNB="$C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 64 --prefill 0"
timeout 170 ncu --profile-from-start off --clock-control none --kernel-name regex:qgw64 --launch-count 3 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,sm__inst_executed.sum \
  $RUNB > $OUT/run$R-ncu.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s"
grep -E "qgw64|Duration|Throughput|Issue Slots|No Eligible|Active Warps|Eligible Warps|Warp Cycles Per Issued|Registers Per|gmma|hit_rate|bytes_read|inst_executed|Stall|Block Limit" $OUT/run$R-ncu.txt | cut -c1-120 | head -80
timeout 150 ncu --profile-from-start off --clock-control none --kernel-name regex:qgw64 --launch-skip 2 --launch-count 1 \
  --section SourceCounters --section WarpStateStats -f -o /tmp/prof $RUNB > $OUT/run$R-ncu-src-log.txt 2>&1
echo "ncu source rc=$? $(( $(date +%s) - S )) s"
sass_top /tmp/prof $OUT/run$R-sass-top.txt
cat $OUT/run$R-sass-top.txt | cut -c1-150
