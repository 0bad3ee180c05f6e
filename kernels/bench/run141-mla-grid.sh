#!/bin/bash
# (Measured and dropped: the grid change was reverted after the session's runs; kernels/NOTES.md, "MLA decode v4".)
# run 141 (one GPU): the MLA decode kernels of mla_decode.cu (v3, v4) on a (head groups, rows,
# splits) grid, so that a row's two 64-head blocks run side by side (at batch 256 they had been
# a wave apart), against the build before ($P, run 140's).
#   attention: kernels-check's attention stage, default kernels (v4 at 128 heads, v3 below).
#   steps: four V3 layers in AWQ (64 experts) at batches 1, 64 and 256, both builds.
#   ncu: v4 in that step at batch 64 (context 2,048), one launch: where its time goes.
# `timeout 575 bash kernels/bench/run141-mla-grid.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-141}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
$P kernels-check --quick --stages sample > $OUT/run$R-prev-compile.txt 2>&1 &
timeout 150 $C kernels-check --stages attention --default-variants > $OUT/run$R-attn.txt 2>&1
echo "attention rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-attn.txt)"
grep -iE "fail|panic|over tol|error" $OUT/run$R-attn.txt | head -5 | cut -c1-200
grep -E "^mla_attention.*decode" $OUT/run$R-attn.txt | cut -c1-170
wait
BENCH_TIMEOUT=60 ab_steps v3l4 1,64,256
grep -hE "profile decode batch 256" $OUT/run$R-v3l4-new.txt $OUT/run$R-v3l4-prev.txt | cut -c1-250
timeout 120 ncu --clock-control none --kernel-name regex:mla_decode4 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,dram__bytes_read.sum \
  $C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 64 --prefill 0 > $OUT/run$R-ncu.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s"
grep -E "mla_decode4|Duration|Throughput|Issue Slots|No Eligible|Active Warps|Eligible Warps|Warp Cycles Per Issued|gmma|hit_rate|bytes_read|Hit Rate|Busy|Stall" $OUT/run$R-ncu.txt | cut -c1-120 | head -50
