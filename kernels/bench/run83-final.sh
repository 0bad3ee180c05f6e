#!/bin/bash
# run 83 (one GPU): the session's final binary (review mends on runs 79-82: routing.cu's warp
# argmax as one helper). The quick pass with golden fixtures and tiny-r1 and with tiny-r1-awq,
# the router and experts stages, and the bf16 V2-Lite steps at batch 1, 16 and 64. `bash kernels/bench/run83-final.sh 85` names run 85's files (the second review's mends).
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-83}
( $C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1 ) &
GP=$!
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run${R}-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run${R}-checks.txt)"
timeout 120 $C kernels-check --quick --compare-model models/tiny-r1-awq > $OUT/run${R}-checks-awq.txt 2>&1
echo "checks awq rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run${R}-checks-awq.txt)"
grep -iE "fail|panic|graphs vs eager|over tol" $OUT/run${R}-checks*.txt | cut -c1-150 | head -16
timeout 150 $C kernels-check --stages router,experts > $OUT/run${R}-stages.txt 2>&1
echo "stages rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run${R}-stages.txt)"
grep -E "^moe_route|over tol" $OUT/run${R}-stages.txt | cut -c1-150 | head -10
wait $GP
timeout 100 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,16,64 --prefill 0 > $OUT/run${R}-v2lite.txt 2>&1
echo "v2lite rc=$? $(( $(date +%s) - S )) s"; grep "CUDA graph" $OUT/run${R}-v2lite.txt | cut -c1-80
rm -rf /dev/shm/v2lite
