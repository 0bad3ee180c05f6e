#!/bin/bash
# Ran on commit f232799 (H100); `CLEAVE_QGEMM_STREAMK=all` was reverted after this run (docs/benchmarks.md).
# run 190 (one GPU): the dense AWQ decode GEMMs on stream-K (`CLEAVE_QGEMM_STREAMK=all`, no
# split-K reduction launch) against split-K (experts, the default), same binary: V2-Lite AWQ and
# four V3 layers in AWQ at 1 and 16 rows. Then the f32 router GEMV with up to four passes' loads in
# flight (this build, $C) against the build before ($P) at batch 1 (four V3 layers, V2-Lite bf16),
# V2-Lite bf16 with PDL on every launch (`CLEAVE_PDL=all`), and kernels-check's linear stage (the
# router rows) and qdecode stage (every AWQ/FP8 linear, stacked pair and expert GEMM against the
# CPU, dense GEMMs both ways) as far as each gets.
# `timeout 570 bash kernels/bench/run190-dense-streamk.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-190}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64; gen_model v2awq --shape v2-lite --dtype awq; gen_model v2bf --shape v2-lite ) &
BENCH_TIMEOUT=90 bench_steps v3l4-sk $C v3l4 1,16 CLEAVE_QGEMM_STREAMK=all
BENCH_TIMEOUT=40 bench_steps v3l4-split $C v3l4 1,16
BENCH_TIMEOUT=40 bench_steps v2awq-sk $C v2awq 1,16 CLEAVE_QGEMM_STREAMK=all
BENCH_TIMEOUT=40 bench_steps v2awq-split $C v2awq 1,16
BENCH_TIMEOUT=70 bench_steps v3l4-prev $P v3l4 1
BENCH_TIMEOUT=35 bench_steps v2bf-new $C v2bf 1,2
BENCH_TIMEOUT=35 bench_steps v2bf-prev $P v2bf 1,2
BENCH_TIMEOUT=35 bench_steps v2bf-pdlall $C v2bf 1,2 CLEAVE_PDL=all
for t in v2awq-sk v2awq-split v3l4-sk v3l4-split; do
  echo "$t b1 profile: $(grep -hE 'profile decode batch 1:' $OUT/run$R-$t.txt | tr ',' '\n' | grep -E 'qg|kernels' | tr '\n' ' ' | cut -c1-300)"
done
for t in v3l4-split v3l4-prev v2bf-new v2bf-prev; do
  echo "$t b1 router: $(grep -hE 'profile decode batch 1:' $OUT/run$R-$t.txt | tr ',' '\n' | grep -E 'gemv_f32|kernels' | tr '\n' ' ' | cut -c1-200)"
done
timeout 45 $C kernels-check --stages linear > $OUT/run$R-linear.txt 2>&1
echo "linear rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-linear.txt)"
grep -iE "fail|panic|over tol|error" $OUT/run$R-linear.txt | head -5 | cut -c1-200
grep -E "router" $OUT/run$R-linear.txt | cut -c1-150
timeout 50 $C kernels-check --stages qdecode > $OUT/run$R-qdecode.txt 2>&1
echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-qdecode.txt)"
grep -iE "fail|panic|over tol|error" $OUT/run$R-qdecode.txt | head -5 | cut -c1-200
grep -E "^linear(_split)? awq" $OUT/run$R-qdecode.txt | cut -c1-150
for t in v2awq-sk v2awq-split v3l4-sk v3l4-split v3l4-prev v2bf-new v2bf-prev v2bf-pdlall; do echo "$t: $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run$R-$t.txt | grep -o '[0-9.]* ms' | tr '\n' ' ')"; done
