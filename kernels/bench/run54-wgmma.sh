#!/bin/bash
# run 54 (one GPU): the wgmma grouped GEMM for prefill-sized expert batches. Checks (the experts
# stage against the CPU with every variant, wgmma against mma.sync on every row; a quick pass with
# the golden fixtures), then the 4096-token prefill of bf16 V2-Lite and of four V3 layers with each
# compiled wgmma shape and with CLEAVE_PREFILL_GEMM=mma (the kernel before) in the same run.
source kernels/bench/lib.sh
S=$(date +%s)
( $C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1
  $C gen-checkpoint --shape v3-layers --out /dev/shm/v3l4 > /dev/null 2>&1 ) &
GP=$!
timeout 280 $C kernels-check --stages experts > $OUT/run54-experts.txt 2>&1
echo "experts rc=$? $(( $(date +%s) - S )) s"
grep -E "moe_experts" $OUT/run54-experts.txt | grep -E "4096|wgmma|prefill|300 tok|FAIL|over" | cut -c1-170 | head -40
grep -iE "fail|panic|error" $OUT/run54-experts.txt | head -5
timeout 150 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run54-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run54-checks.txt)"
grep -iE "fail|panic|over tol|wgmma" $OUT/run54-checks.txt | cut -c1-160 | head -10
wait $GP
for m in v2lite v3l4; do
  for v in mma wgmma wgmma:128x128/4 wgmma:64x256/3; do
    f=$OUT/run54-$m-$(echo $v | tr ':/' '__').txt
    CLEAVE_PREFILL_GEMM=$v timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/$m --batches 1 --prefill 4096 > $f 2>&1
    echo "$m $v rc=$? $(( $(date +%s) - S )) s: $(grep -A1 'prefill of one' $f | tail -1)"
    grep -E "profile prefill" $f | cut -c1-300
  done
done
rm -rf /dev/shm/v2lite /dev/shm/v3l4
