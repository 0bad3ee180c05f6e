#!/bin/bash
# run 57 (one GPU): checks of the final binary. qdecode (full: FP8 experts at 1, 16, 64 tokens on
# the persistent kernel and 1024 tokens on the FP8 wgmma grouped GEMM, each against the CPU's
# linears fed the same quantized activations on every row; both activation orders byte for byte),
# the experts stage (bf16 wgmma shapes against mma.sync on every row), then the quick pass with the
# golden fixtures and tiny-r1 (graphs vs eager).
source kernels/bench/lib.sh
S=$(date +%s)
timeout 280 $C kernels-check --stages qdecode,experts > $OUT/run57-stages.txt 2>&1
echo "stages rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run57-stages.txt)"
grep -E "moe_experts fp8|act_quant|moe_experts wgmma" $OUT/run57-stages.txt | cut -c1-170
grep -iE "fail|panic|error" $OUT/run57-stages.txt | head -5
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run57-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run57-checks.txt)"
grep -iE "fail|panic|over tol|wgmma|graphs vs eager" $OUT/run57-checks.txt | cut -c1-160 | head -20
