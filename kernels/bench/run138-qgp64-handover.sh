#!/bin/bash
# run 138 (one GPU): the 64-row compressed decode GEMM (qgp64_*) with its stream-K hand-over
# batched by 32 values instead of 64 (AWQ: 160 registers instead of 194, three blocks an SM
# instead of two), against the build before ($P): the tiny-r1-awq quick pass, four V3 layers and
# V2-Lite in AWQ at batches 1 and 64. Both builds' kernels compile side by side first.
# `timeout 280 bash kernels/bench/run138-qgp64-handover.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-138}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64; gen_model v2awq --shape v2-lite --dtype awq ) &
$P kernels-check --quick --stages sample > $OUT/run$R-prev-compile.txt 2>&1 &
timeout 150 $C kernels-check --quick --compare-model models/tiny-r1-awq > $OUT/run$R-checks-awq.txt 2>&1
echo "checks awq rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-checks-awq.txt)"
grep -iE "fail|panic|graphs vs eager|over tol" $OUT/run$R-checks-awq.txt | head -4 | cut -c1-160
wait
ab_steps v3l4 1,64
ab_steps v2awq 1,64
ab_steps v3l4 64
