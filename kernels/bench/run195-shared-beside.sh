#!/bin/bash
# run 195 (one GPU): folded shared experts on the side stream at decode batches up to 4
# (`CLEAVE_SHARED_BESIDE`, default 4) against inside the routed experts' GEMMs (`off`), same
# binary: the quick pass first (its MoE-layer checks at 3 tokens take the side stream, CPU
# reference; tiny-r1 graphs against eager), then decode steps on V2-Lite bf16 and AWQ and on 30
# V3 layers in AWQ (64 routed experts, dummy weights; the 61-layer share needs an H200).
# `timeout 570 bash kernels/bench/run195-shared-beside.sh [RUN]`
# Ran on commit 7cecb17 (its first try, on 2d91b82, failed: results/run195-*-a.txt), with the
# 30-layer steps inline (now lib.sh's v3x30_gen and v3x30_steps, the same commands); the code was
# reverted afterwards (docs/benchmarks.md, "Tried and dropped: shared experts on a side stream").
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-195}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v2bf --shape v2-lite &
gen_model v2awq --shape v2-lite --dtype awq &
v3x30_gen
quick_checks $R
grep -E "moe_experts .*shared|moe layer" $OUT/run$R-checks.txt | cut -c1-170 | head -12
BENCH_TIMEOUT=70 bench_steps v2bf-on $C v2bf 1,2,4
BENCH_TIMEOUT=50 bench_steps v2bf-off $C v2bf 1,2,4 CLEAVE_SHARED_BESIDE=off
BENCH_TIMEOUT=50 bench_steps v2awq-on $C v2awq 1,2
BENCH_TIMEOUT=40 bench_steps v2awq-off $C v2awq 1,2 CLEAVE_SHARED_BESIDE=off
v3x30_steps v3x30-on
v3x30_steps v3x30-off CLEAVE_SHARED_BESIDE=off
BENCH_TIMEOUT=50 bench_steps v2bf-on2 $C v2bf 1
for t in v2bf-on v2bf-off v3x30-on v3x30-off; do
  echo "$t b1: $(grep -hE 'profile decode batch 1:' $OUT/run$R-$t.txt | cut -c1-330)"
done
