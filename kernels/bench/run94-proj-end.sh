#!/bin/bash
# run 94 (one GPU): a compressed o_proj's split-K partials summed by the residual's RMSNorm
# (`linear_add_norm`, rms_norm_f32 over the partials: one launch fewer per layer), on top of runs
# 92-93. Binaries: cleave-prev (5b631fb) and cleave (this commit).
#   checks: the quick pass (golden fixtures, tiny-r1, tiny-r1-awq), graphs vs eager; the full
#           qdecode stage (the projection's end at V3's and V2-Lite's o_proj shapes).
#   steps:  AWQ and FP8 V2-Lite and four V3 layers in AWQ, both binaries in the same run, and the
#           new one with CLEAVE_PROJ_END=separate.
# `bash kernels/bench/run94-proj-end.sh [RUN]`.
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-94}
( gen_model v2awq --shape v2-lite --dtype awq; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64
  gen_model v2fp8 --shape v2-lite --dtype fp8 ) &
GP=$!
quick_checks $R
timeout 200 $C kernels-check --stages qdecode > $OUT/run${R}-qdecode.txt 2>&1
echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-qdecode.txt)"
grep -E "over tol|add, norm" $OUT/run${R}-qdecode.txt | cut -c1-150 | head -20
bench_steps awq-prev $P v2awq 1,8,64
bench_steps awq-new $C v2awq 1,8,64
bench_steps awq-sep $C v2awq 1,8,64 CLEAVE_PROJ_END=separate
BENCH_TIMEOUT=60 bench_steps v3-prev $P v3l4 1,8,64
BENCH_TIMEOUT=60 bench_steps v3-new $C v3l4 1,8,64
rm -rf /dev/shm/v2awq* /dev/shm/v3l4*
bench_steps fp8-prev $P v2fp8 1,8,64
bench_steps fp8-new $C v2fp8 1,8,64
grep -h "profile decode batch" $OUT/run${R}-awq-new.txt | cut -c1-330
wait $GP
rm -rf /dev/shm/v2*
