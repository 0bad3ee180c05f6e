#!/bin/bash
# run 93 (one GPU): run 92's changes with the router's GEMV loading every row's inputs before
# its products (run 92's loaded them row by row: at 256 rows slower than cuBLAS) and taking
# groups of 4 rows past 8. Binaries: cleave-prev (5b631fb) and cleave (this commit).
#   checks: the quick pass, graphs vs eager; the full linear stage.
#   steps:  bf16 and AWQ V2-Lite, both binaries in the same run; the new one with
#           CLEAVE_ROUTER_GEMV=off (only the MoE-end change).
# `bash kernels/bench/run93-router-rows.sh [RUN]`.
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-93}
( gen_model v2lite --shape v2-lite; gen_model v2awq --shape v2-lite --dtype awq ) &
GP=$!
quick_checks $R
timeout 200 $C kernels-check --stages linear > $OUT/run${R}-stages.txt 2>&1
echo "stages rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-stages.txt)"
grep -E "over tol|router" $OUT/run${R}-stages.txt | cut -c1-150 | head -20
bench_steps v2-prev $P v2lite 1,4,16,64,128,256
bench_steps v2-new $C v2lite 1,4,16,64,128,256
bench_steps v2-norouter $C v2lite 16,64,128,256 CLEAVE_ROUTER_GEMV=off
bench_steps v2-prev2 $P v2lite 16,64,128,256
bench_steps v2-new2 $C v2lite 16,64,128,256
rm -rf /dev/shm/v2lite
bench_steps awq-prev $P v2awq 1,16,64,256
bench_steps awq-new $C v2awq 1,16,64,256
grep -h "profile decode batch" $OUT/run${R}-v2-new.txt | cut -c1-330
wait $GP
rm -rf /dev/shm/v2*
