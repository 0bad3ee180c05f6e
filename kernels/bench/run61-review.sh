#!/bin/bash
# run 61 (one GPU): the review mends (derived PDL set, FP8 wgmma kernel table, flash prefill's
# shared-memory limit set at start-up, routed rows only): qdecode (FP8 wgmma experts against the
# CPU's W8A8 reference, every row), prefill (flash, both instances), the quick golden pass with
# graphs vs eager (PDL launches), then the FP8 and bf16 V3-layer prefill.
source kernels/bench/lib.sh
S=$(date +%s)
$C gen-checkpoint --shape v3-layers --dtype fp8 --out /dev/shm/v3fp8 > /dev/null 2>&1 &
GP=$!
timeout 250 $C kernels-check --stages qdecode,prefill > $OUT/run61-stages.txt 2>&1
echo "stages rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run61-stages.txt)"
grep -E "moe_experts fp8 b128 wgmma|flash +4096" $OUT/run61-stages.txt | cut -c1-170
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run61-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run61-checks.txt)"
grep -iE "fail|panic|over tol" $OUT/run61-checks.txt | cut -c1-160 | head
wait $GP
timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/v3fp8 --batches 1 --prefill 4096 > $OUT/run61-v3fp8.txt 2>&1
echo "v3fp8 rc=$? $(( $(date +%s) - S )) s: $(grep -A1 'prefill of one' $OUT/run61-v3fp8.txt | tail -1)"
rm -rf /dev/shm/v3fp8
