#!/bin/bash
# run 60 (one GPU): the 4096-token prefill of FP8 V2-Lite and four FP8 V3 layers on the final
# binary (FP8 wgmma experts, the DeepSeek-dims flash kernel), per-kernel profile.
source kernels/bench/lib.sh
S=$(date +%s)
$C gen-checkpoint --shape v2-lite --dtype fp8 --out /dev/shm/v2fp8 > /dev/null 2>&1
$C gen-checkpoint --shape v3-layers --dtype fp8 --out /dev/shm/v3fp8 > /dev/null 2>&1
for m in v2fp8 v3fp8; do
  f=$OUT/run60-$m.txt
  timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/$m --batches 1 --prefill 4096 > $f 2>&1
  echo "$m rc=$? $(( $(date +%s) - S )) s: $(grep -A1 'prefill of one' $f | tail -1)"
  grep -E "profile prefill" $f | cut -c1-260
done
rm -rf /dev/shm/v2fp8 /dev/shm/v3fp8
