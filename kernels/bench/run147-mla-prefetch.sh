#!/bin/bash
# (Measured and dropped: the L2 prefetch was reverted after this run; kernels/NOTES.md, "MLA decode v4".)
# run 147 (one GPU): run 146's seesaw v4 with the pair after next prefetched into L2 (by a thread
# about to wait at a barrier), against run 146's build ($P). The attention stage with v4 named,
# four V3 layers in AWQ (64 experts) at batches 1, 64 and 256 with both builds, and ncu's stall
# reasons for the new kernel at batch 64 (context 2,048).
# `timeout 450 bash kernels/bench/run147-mla-prefetch.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-147}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
$P kernels-check --quick --stages sample > $OUT/run$R-prev-compile.txt 2>&1 &
attention_check v4 CLEAVE_MLA_DECODE=v4
wait
BENCH_TIMEOUT=60 ab_steps v3l4 1,64,256
for t in new prev; do echo "== $t"; grep -hE "profile decode batch (64|256)" $OUT/run$R-v3l4-$t.txt | grep -oE "(batch [0-9]+|mla_decode[0-9a-z_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' '; echo; done
timeout 100 ncu --clock-control none --kernel-name regex:mla_decode4 --launch-count 1 --section SpeedOfLight \
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,lts__t_sector_hit_rate.pct,dram__bytes_read.sum \
  $C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 64 --prefill 0 > $OUT/run$R-ncu.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s"
grep -E "Duration|DRAM Through|hit_rate|bytes_read" $OUT/run$R-ncu.txt | cut -c1-120
grep -E "stalled" $OUT/run$R-ncu.txt | awk '$NF > 0.05' | sed 's/smsp__average_warps_issue_stalled_//' | cut -c1-120
