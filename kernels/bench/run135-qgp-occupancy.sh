#!/bin/bash
# run 135 (one GPU): the compressed decode GEMMs at four resident blocks an SM (the stream-K
# hand-over batched by 32 values, `__launch_bounds__(128, 4)` where 128 registers fit without
# spilling) against the build before ($P, three blocks): the quick pass, the qdecode stage
# (every AWQ/FP8 linear, stacked pair and expert GEMM against the CPU), AWQ and FP8 V2-Lite and
# four V3 layers in AWQ, the ncu table of the four-layer step's AWQ GEMMs, and the 61-layer V3
# AWQ share at batch 1.
# `timeout 570 bash kernels/bench/run135-qgp-occupancy.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-135}
nvidia-smi --query-gpu=name --format=csv,noheader
ls /usr/local/cuda/lib64/ | grep -i 'libnvrtc.so\.' | head -2
( gen_model v2awq --shape v2-lite --dtype awq; gen_model v2fp8 --shape v2-lite --dtype fp8; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
quick_checks $R
timeout 120 $C kernels-check --stages qdecode > $OUT/run$R-qdecode.txt 2>&1
echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-qdecode.txt)"
grep -iE "fail|over tol|panic" $OUT/run$R-qdecode.txt | head -5 | cut -c1-160
for m in v2awq:1,16,64 v2fp8:1,64 v3l4:1,8,64; do ab_steps ${m%:*} ${m#*:}; done
M=gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
timeout 90 ncu --profile-from-start off --clock-control none --kernel-name regex:qgp --launch-count 10 --metrics $M --csv --print-units base \
  $C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 1 --prefill 0 > $OUT/run$R-ncu.csv 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s"
ncu_launches $OUT/run$R-ncu.csv
SHARE_END=560 share_steps 1
