#!/bin/bash
# run 92 (one GPU): the f32 router gate on the GEMV in groups of 8 rows at every decode batch (up
# to 256 rows; cuBLAS's SGEMM before), and the MoE end in one kernel also where the shared
# experts run as dense GEMMs (beyond 64 rows and at prefill: they now accumulate into the
# residual, then moe_combine_norm). Two binaries travel gzipped: cleave-prev (5b631fb) and
# cleave (this commit).
#   checks: the quick pass (golden fixtures, tiny-r1, tiny-r1-awq), graphs vs eager; the full
#           linear stage (router at 64-256 rows, cuBLAS and the GEMV) and experts stage (the
#           MoE layer with dense shared experts at 256 and 4,096 tokens).
#   steps:  bf16 V2-Lite, both binaries in the same run, twice; the new one with
#           CLEAVE_ROUTER_GEMV=off to split the two changes.
# `bash kernels/bench/run92-router-end.sh [RUN]`.
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-92}
( gen_model v2lite --shape v2-lite ) &
GP=$!
quick_checks $R
timeout 200 $C kernels-check --stages linear,experts > $OUT/run${R}-stages.txt 2>&1
echo "stages rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-stages.txt)"
grep -E "over tol|router|moe layer" $OUT/run${R}-stages.txt | cut -c1-170 | head -40
bench_steps v2-prev $P v2lite 1,16,64,128,256
bench_steps v2-new $C v2lite 1,16,64,128,256
bench_steps v2-prev2 $P v2lite 64,128,256
bench_steps v2-new2 $C v2lite 64,128,256
bench_steps v2-norouter $C v2lite 64,256 CLEAVE_ROUTER_GEMV=off
grep -h "profile decode batch" $OUT/run${R}-v2-new.txt | cut -c1-330
wait $GP
rm -rf /dev/shm/v2lite*
