#!/bin/bash
# run 146 (one GPU): MLA decode v4 rewritten on FlashMLA's "seesaw" schedule (warpgroups on
# alternate 64-key tiles, each holding half the output; per-block mbarriers on the key buffers)
# against the build before ($P: v4 with both warpgroups on every tile, three barriers a tile).
#   attention: kernels-check's attention stage with v4 named (16 and 32 heads pad its block;
#     odd and even tile counts, one split writing the output) against the CPU.
#   steps: four V3 layers in AWQ (64 experts) at batches 1, 64 and 256, both builds, and the
#     kernel's time in each step's profile.
#   ncu: the new v4 in that step at batch 64 (context 2,048), one launch.
# `timeout 570 bash kernels/bench/run146-mla-seesaw.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-146}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
$P kernels-check --quick --stages sample > $OUT/run$R-prev-compile.txt 2>&1 &
attention_check v4 CLEAVE_MLA_DECODE=v4
wait
BENCH_TIMEOUT=60 ab_steps v3l4 1,64,256
for t in new prev; do echo "== $t"; grep -hE "profile decode batch (64|256)" $OUT/run$R-v3l4-$t.txt | grep -oE "(batch [0-9]+|mla_decode[0-9a-z_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' '; echo; done
timeout 100 ncu --clock-control none --kernel-name regex:mla_decode4 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,dram__bytes_read.sum \
  $C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 64 --prefill 0 > $OUT/run$R-ncu.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s"
grep -E "Duration|Throughput|Issue Slots|No Eligible|Eligible Warps|Warp Cycles Per Issued|gmma|hit_rate|bytes_read|Stall" $OUT/run$R-ncu.txt | cut -c1-120 | head -30
