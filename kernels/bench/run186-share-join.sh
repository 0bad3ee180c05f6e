#!/bin/bash
# run 186 (one GPU): the 61-layer V3 AWQ share (one GPU's, dummy weights) at batches 1 and 16 with
# MLA decode merging its own splits (CLEAVE_MLA_COMBINE=fused, the default) and with a mla_combine
# launch (separate), HEAD's build, one load each.
# `timeout 570 bash kernels/bench/run186-share-join.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-186}
nvidia-smi --query-gpu=name --format=csv,noheader
$C gen-checkpoint --config-only --shape v3-layers --layers 61 --routed-experts 64 --dtype awq --out /tmp/v3x61 > /dev/null
for mode in fused separate; do
  f=$OUT/run$R-v3-61-$mode.txt
  CLEAVE_MLA_COMBINE=$mode timeout 270 $C kernels-check --no-ops --bench-model /tmp/v3x61 --load-format dummy \
    --ctx 2048 --batches 1,16 --prefill 0 > $f 2>&1
  echo "$mode rc=$? $(( $(date +%s) - S )) s: $(grep -o 'CUDA graph: step [0-9.]* ms ([0-9.]*% of HBM' $f | tr '\n' ' ')"
done
