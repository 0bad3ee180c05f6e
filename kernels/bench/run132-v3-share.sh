#!/bin/bash
# run 132 (one GPU): run 131's build (the batch-1 small kernels off their critical path) on the V3
# shapes: four V3 layers in AWQ (64 experts) at batch 1/4/64 against the build before ($P), and the
# 61-layer V3 AWQ share at batch 1.
# `timeout 570 bash kernels/bench/run132-v3-share.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-132}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 &
for b in new prev; do
  bin=$C; [ $b = prev ] && bin=$P
  BENCH_TIMEOUT=80 bench_steps v3l4-$b $bin v3l4 1,4,64
done
share_steps 1
