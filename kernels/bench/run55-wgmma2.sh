#!/bin/bash
# run 55 (one GPU): the wgmma grouped GEMM with two warpgroups per 128 x 256 tile. Checks (the
# experts stage: every variant against the CPU, each wgmma shape against mma.sync on every row),
# then the 4096-token prefill of bf16 V2-Lite and of four V3 layers with each compiled shape and
# with CLEAVE_PREFILL_GEMM=mma in the same run.
source kernels/bench/lib.sh
S=$(date +%s)
( $C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1
  $C gen-checkpoint --shape v3-layers --out /dev/shm/v3l4 > /dev/null 2>&1 ) &
GP=$!
timeout 280 $C kernels-check --stages experts > $OUT/run55-experts.txt 2>&1
echo "experts rc=$? $(( $(date +%s) - S )) s"
grep -E "moe_experts" $OUT/run55-experts.txt | grep -E "wgmma|v2 +4096|mma-prefill +4096" | cut -c1-170
grep -iE "fail|panic|error" $OUT/run55-experts.txt | head -5
wait $GP
for m in v2lite v3l4; do
  for v in mma wgmma:128x128/3 wgmma:128x256/3 wgmma:128x256/4; do
    f=$OUT/run55-$m-$(echo $v | tr ':/' '__').txt
    CLEAVE_PREFILL_GEMM=$v timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/$m --batches 1 --prefill 4096 > $f 2>&1
    echo "$m $v rc=$? $(( $(date +%s) - S )) s: $(grep -A1 'prefill of one' $f | tail -1)"
    grep -E "profile prefill" $f | cut -c1-200
  done
done
rm -rf /dev/shm/v2lite /dev/shm/v3l4
