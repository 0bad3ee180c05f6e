#!/bin/bash
# run 191 (one GPU): the 61-layer V3 AWQ share (one GPU's, dummy weights) at batches 1, 16 and 64
# with the dense AWQ GEMMs on stream-K (`CLEAVE_QGEMM_STREAMK=all`) and on split-K (experts, the
# default), HEAD's build, one load each.
# `timeout 570 bash kernels/bench/run191-share-streamk.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-191}
nvidia-smi --query-gpu=name --format=csv,noheader
$C gen-checkpoint --config-only --shape v3-layers --layers 61 --routed-experts 64 --dtype awq --out /tmp/v3x61 > /dev/null
for mode in all experts; do
  f=$OUT/run$R-v3-61-$mode.txt
  CLEAVE_QGEMM_STREAMK=$mode timeout 270 $C kernels-check --no-ops --bench-model /tmp/v3x61 --load-format dummy \
    --ctx 2048 --batches 1,16,64 --prefill 0 > $f 2>&1
  echo "$mode rc=$? $(( $(date +%s) - S )) s: $(grep -o 'CUDA graph: step [0-9.]* ms ([0-9.]*% of HBM' $f | tr '\n' ' ')"
  grep -hE 'profile decode batch 1:' $f | tr ',' '\n' | grep -E 'qg|kernels' | tr '\n' ' ' | cut -c1-300; echo
done
