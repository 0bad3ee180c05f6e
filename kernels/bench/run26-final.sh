#!/bin/bash
# run 26 (one GPU): the compressed decode with the persistent kernel's final defaults (issue 12):
# V2-Lite in AWQ and FP8 at batch 1/16/64/256, then the real model's share (61 layers of V3 in
# AWQ with 64 routed experts per layer, run 19's measurement) on the persistent kernel.
source kernels/bench/lib.sh
for d in awq fp8; do
  $C gen-checkpoint --shape v2-lite --dtype $d --out /dev/shm/v2lite-$d > /dev/null 2>&1
  timeout 100 $C kernels-check --no-ops --bench-model /dev/shm/v2lite-$d --batches 1,16,64,256 --prefill 0 > $OUT/run26-v2lite-$d.txt 2>&1
  echo "bench v2lite $d rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ " $OUT/run26-v2lite-$d.txt | cut -c1-110
  rm -rf /dev/shm/v2lite-$d
done
bash kernels/bench/run19-v3-awq61.sh
mv $OUT/run19-bench.txt $OUT/run26-v3-awq61.txt
