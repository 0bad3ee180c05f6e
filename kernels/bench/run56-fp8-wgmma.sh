#!/bin/bash
# run 56 (one GPU): the FP8 wgmma grouped GEMM (W8A8) for prefill-sized FP8 expert batches, and
# the bf16 wgmma default (128x256/4). Checks: the quant stage (every format's experts against the
# CPU, FP8 wgmma against the tiled kernel on every row, both activation orders byte for byte),
# qdecode's activation check, a quick pass with the golden fixtures; then the 4096-token prefill
# of FP8 V2-Lite and four FP8 V3 layers with CLEAVE_PREFILL_FP8=mma, wgmma:4 and wgmma:5.
source kernels/bench/lib.sh
S=$(date +%s)
( $C gen-checkpoint --shape v2-lite --dtype fp8 --out /dev/shm/v2fp8 > /dev/null 2>&1
  $C gen-checkpoint --shape v3-layers --dtype fp8 --out /dev/shm/v3fp8 > /dev/null 2>&1 ) &
GP=$!
timeout 200 $C kernels-check --stages quant,qdecode > $OUT/run56-quant.txt 2>&1
echo "quant rc=$? $(( $(date +%s) - S )) s"
grep -E "moe_experts fp8|act_quant" $OUT/run56-quant.txt | grep -E "4096|wgmma|act_quant|256 tok" | cut -c1-170
grep -iE "fail|panic|error" $OUT/run56-quant.txt | head -5
timeout 150 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run56-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run56-checks.txt)"
grep -iE "fail|panic|over tol|wgmma" $OUT/run56-checks.txt | cut -c1-160 | head -10
wait $GP
for m in v2fp8 v3fp8; do
  for v in mma wgmma:4 wgmma:5; do
    f=$OUT/run56-$m-$(echo $v | tr ':/' '__').txt
    CLEAVE_PREFILL_FP8=$v timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/$m --batches 1 --prefill 4096 > $f 2>&1
    echo "$m $v rc=$? $(( $(date +%s) - S )) s: $(grep -A1 'prefill of one' $f | tail -1)"
    grep -E "profile prefill" $f | cut -c1-260
  done
done
rm -rf /dev/shm/v2fp8 /dev/shm/v3fp8
