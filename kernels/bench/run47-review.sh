#!/bin/bash
# run 47 (one GPU): the review's change (compressed stacks uploaded through QWeights::matrices):
# the quick pass with golden fixtures (AWQ, FP8) and tiny-r1, graphs vs eager.
source kernels/bench/lib.sh
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run47-checks.txt 2>&1
echo "checks rc=$? $(tail -1 $OUT/run47-checks.txt)"
grep -iE "fail|panic|graphs vs eager|moe_experts (awq|fp8).*shared|linear (awq|fp8)" $OUT/run47-checks.txt | cut -c1-150 | head -30
