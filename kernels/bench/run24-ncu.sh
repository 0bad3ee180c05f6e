#!/bin/bash
# run 24 (one GPU): why the persistent AWQ decode GEMM stays near 40% of HBM where FP8 reaches
# 95%: ncu on the first launch of each (V2-Lite gate/up, 16 tokens, qgemm_tune's first case),
# then the qgemm_tune sweep with the added AWQ shapes. Expects the stripped binary in .carry/.
source kernels/bench/lib.sh
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
$C kernels-check --quick --stages elementwise > /dev/null 2>&1  # compiles the kernel cache
for k in qgp_awq_128_64_6_silu qgp_fp8_128_128_4_silu qg16_awq_silu; do
  timeout 150 $NCU --kernel-name $k --launch-count 1 --kill on --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section SchedulerStats --section LaunchStats --section InstructionStats \
    $C kernels-check --stages qgemm_tune > $OUT/ncu-$k.txt 2>&1
  echo "== $k rc=$?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Executed Ipc A|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Achieved Occupancy|Registers Per|Block Limit|Waves Per SM|Executed Instructions  |Warp Cycles Per Issued|Stall|Grid Size|Theoretical Occ" $OUT/ncu-$k.txt | grep -v "^==PROF" | sed 's/  */ /g' | head -40
done
timeout 200 $C kernels-check --stages qgemm_tune > $OUT/tune.txt 2>&1; echo "tune rc=$?"
grep -E "over tol|failed|rror|panic" $OUT/tune.txt | head -5
sed -n '/^qgemm_tune:/,$p' $OUT/tune.txt | grep -E "awq|fp8 g128 V2-Lite|fp8 g128 V3 (16|64) tok" | cut -c1-190
grep -E "qgp awq g(64|128) .*V3 64 tok" $OUT/tune.txt | cut -c1-150
