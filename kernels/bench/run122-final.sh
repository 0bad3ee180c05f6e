#!/bin/bash
# run 122 (one GPU): the session's final build (flag helpers moved into common.cuh): every module
# compiles, moe_align against its reference (router stage), the quick pass (golden fixtures,
# tiny-r1, tiny-r1-awq graphs vs eager), and V2-Lite AWQ decode steps (stream-K on and off,
# graphs against eager).
# `timeout 250 bash kernels/bench/run122-final.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-122}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v2awq --shape v2-lite --dtype awq &
timeout 120 $C kernels-check --stages router > $OUT/run$R-router.txt 2>&1
echo "router rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run$R-router.txt)"
grep -iE "over tol|fail|panic|error" $OUT/run$R-router.txt | head -5 | cut -c1-200
quick_checks $R
BENCH_TIMEOUT=60 bench_steps v2awq $C v2awq 1,16,64,256
grep -E "CUDA graph" $OUT/run$R-v2awq.txt | cut -c1-170
