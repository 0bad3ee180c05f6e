#!/bin/bash
# runs 114 and 118 (one GPU): the real model's decode, one GPU's share (61 V3 layers in AWQ g64, 64 routed
# experts per layer, context 2,048; random weights made at load, `--load-format dummy`), batches 1
# and 64 (run 118: BATCHES=1,64,128; 256 needs 131 GiB with the KV, over 90% of an H200): the CUDA-graph step with stream-K on (the default) and off, captured in the same process
# (kernels-check's bench times the other work split after the default for compressed models).
# `bash kernels/bench/run114-v3-61-streamk.sh [RUN]`.
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-114}
nvidia-smi --query-gpu=name --format=csv,noheader
$C gen-checkpoint --config-only --shape v3-layers --layers 61 --routed-experts 64 --dtype awq --out /tmp/v3x61 > /dev/null
timeout 540 $C kernels-check --no-ops --bench-model /tmp/v3x61 --load-format dummy --ctx 2048 --batches ${BATCHES:-1,64} --prefill 0 \
  > $OUT/run$R-v3-61.txt 2>&1
echo "v3-61 rc=$? $(( $(date +%s) - S )) s: $(grep -o 'loaded in [0-9.]* s' $OUT/run$R-v3-61.txt)"
grep -E "^ +[0-9]+ +[0-9.]+ |CUDA graph|profile decode|in use" $OUT/run$R-v3-61.txt | cut -c1-330
