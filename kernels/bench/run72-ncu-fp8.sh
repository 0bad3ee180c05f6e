#!/bin/bash
# run 72 (one GPU): what bounds the warp-specialized FP8 wgmma expert GEMM (run 71: ~435 TFLOP/s
# on the V3 gate/up). ncu over its first gate/up launch in the 4096-token prefill of four FP8 V3
# layers. Run 75 repeats it on run 74's kernel, with the stall table (`... run72-ncu-fp8.sh 75`).
source kernels/bench/lib.sh
S=$(date +%s)
$C gen-checkpoint --shape v3-layers --dtype fp8 --out /dev/shm/v3fp8 > /dev/null 2>&1
timeout 400 ncu -k regex:ggw_fp8_128x128_6_silu --launch-count 1 --section SpeedOfLight --section Occupancy \
  --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section LaunchStats --section SourceCounters $C kernels-check --no-ops --bench-model /dev/shm/v3fp8 --batches 1 --prefill 4096 > $OUT/run${1:-72}-ncu.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s"
grep -vE "^==PROF==|^ +-+$" $OUT/run${1:-72}-ncu.txt | grep -E "Duration|Throughput|Warp Cycles|Stall|Issued|Eligible|Occupancy|Registers|Shared|Active Warps|No Eligible|Pipe|Executed Ipc|L1|L2|DRAM|Block Limit|Tensor|Hit" | head -70
rm -rf /dev/shm/v3fp8
