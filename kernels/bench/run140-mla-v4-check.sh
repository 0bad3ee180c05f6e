#!/bin/bash
# run 140 (one GPU): run 139's build forced v4 onto v3 whenever named (CLEAVE_MLA_DECODE=v4), so
# its "v4" attention stage ran v3; only the default (v4 at 128 heads) ran v4, in the steps. Here,
# with that mended: kernels-check's attention stage with v4 on every case (16 and 32 heads pad
# its 64-head block) against the CPU, the quick pass, then ncu on v4 in four V3 layers' step at
# batch 64 (context 2,048): where its time goes.
# `timeout 400 bash kernels/bench/run140-mla-v4-check.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-140}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
CLEAVE_MLA_DECODE=v4 timeout 150 $C kernels-check --stages attention --default-variants > $OUT/run$R-attn-v4.txt 2>&1
echo "attention v4 rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-attn-v4.txt)"
grep -iE "fail|panic|over tol|error" $OUT/run$R-attn-v4.txt | head -5 | cut -c1-200
grep -E "blocks per SM" $OUT/run$R-attn-v4.txt | tail -2
grep -E "^mla_attention" $OUT/run$R-attn-v4.txt | cut -c1-170
timeout 90 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run$R-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-checks.txt)"
grep -iE "fail|panic|over tol" $OUT/run$R-checks.txt | cut -c1-160 | head -6
while [ ! -f /dev/shm/v3l4.done ]; do sleep 1; done
timeout 150 ncu --profile-from-start off --clock-control none --kernel-name regex:mla_decode4 --launch-skip 4 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,dram__bytes_read.sum \
  $C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 64 --prefill 0 > $OUT/run$R-ncu.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s"
grep -E "mla_decode4|Duration|Throughput|Issue Slots|No Eligible|Active Warps|Eligible Warps|Warp Cycles Per Issued|Registers|gmma|hit_rate|bytes_read|Hit Rate|Pipe|Stall" $OUT/run$R-ncu.txt | cut -c1-120 | head -60
