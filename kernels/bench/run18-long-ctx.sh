#!/bin/bash
# run 18 (one GPU): decode step times of long reasoning traces (issue 15 item 4). The V2-Lite shape
# (random bf16 weights) at context 1024, 8192 and 32768: every sequence of the batch at that
# context, greedy sampling on the GPU; % of HBM counts weights and the KV read.
source kernels/bench/lib.sh
$C gen-checkpoint --shape v2-lite --dtype bf16 --out /dev/shm/v2lite > /tmp/gen.txt 2>&1 || { tail -3 /tmp/gen.txt; exit 1; }
for spec in "1024 1,64,256" "8192 1,64,256" "32768 1,16,64"; do
  set -- $spec
  timeout 250 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --ctx $1 --batches $2 --prefill 0 > /tmp/ctx$1.txt 2>&1
  echo "ctx $1 rc=$?"; grep -E "KV cache|decode|batch" /tmp/ctx$1.txt | tail -6
done
