#!/bin/bash
# run 59 (one GPU): the flash prefill kernel with DeepSeek's head dims compiled in. The prefill
# stage (every case against the CPU; V2-Lite and V3 heads at 4096 rows timed), then the
# 4096-token prefill of bf16 V2-Lite and of four V3 layers (profile per kernel), and the quick
# golden pass.
source kernels/bench/lib.sh
S=$(date +%s)
( $C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1
  $C gen-checkpoint --shape v3-layers --out /dev/shm/v3l4 > /dev/null 2>&1 ) &
GP=$!
timeout 200 $C kernels-check --stages prefill > $OUT/run59-prefill.txt 2>&1
echo "prefill stage rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run59-prefill.txt)"
grep -E "flash" $OUT/run59-prefill.txt | cut -c1-170
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run59-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run59-checks.txt)"
grep -iE "fail|panic|over tol" $OUT/run59-checks.txt | cut -c1-160 | head -10
wait $GP
for m in v2lite v3l4; do
  f=$OUT/run59-$m.txt
  timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/$m --batches 1 --prefill 4096 > $f 2>&1
  echo "$m rc=$? $(( $(date +%s) - S )) s: $(grep -A1 'prefill of one' $f | tail -1)"
  grep -E "profile prefill" $f | cut -c1-260
done
rm -rf /dev/shm/v2lite /dev/shm/v3l4
