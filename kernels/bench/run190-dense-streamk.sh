#!/bin/bash
# run 190 (one GPU): the dense AWQ decode GEMMs on stream-K (`CLEAVE_QGEMM_STREAMK=all`, no
# split-K reduction launch) against split-K (experts, the default), same binary: V2-Lite AWQ and
# four V3 layers in AWQ at 1 and 16 rows, then the qdecode stage (every AWQ/FP8 linear, stacked pair
# and expert GEMM against the CPU, dense GEMMs both ways) as far as it gets in 50 s.
# `timeout 570 bash kernels/bench/run190-dense-streamk.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-190}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64; gen_model v2awq --shape v2-lite --dtype awq ) &
BENCH_TIMEOUT=90 bench_steps v3l4-sk $C v3l4 1,16 CLEAVE_QGEMM_STREAMK=all
BENCH_TIMEOUT=40 bench_steps v3l4-split $C v3l4 1,16
BENCH_TIMEOUT=40 bench_steps v2awq-sk $C v2awq 1,16 CLEAVE_QGEMM_STREAMK=all
BENCH_TIMEOUT=40 bench_steps v2awq-split $C v2awq 1,16
for t in v2awq-sk v2awq-split v3l4-sk v3l4-split; do
  echo "$t b1 profile: $(grep -hE 'profile decode batch 1:' $OUT/run$R-$t.txt | tr ',' '\n' | grep -E 'qg|kernels' | tr '\n' ' ' | cut -c1-300)"
done
timeout 50 $C kernels-check --stages qdecode > $OUT/run$R-qdecode.txt 2>&1
echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-qdecode.txt)"
grep -iE "fail|panic|over tol|error" $OUT/run$R-qdecode.txt | head -5 | cut -c1-200
grep -E "^linear(_split)? awq" $OUT/run$R-qdecode.txt | cut -c1-150
for t in v2awq-sk v2awq-split v3l4-sk v3l4-split; do echo "$t: $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run$R-$t.txt | grep -o '[0-9.]* ms' | tr '\n' ' ')"; done
