#!/bin/bash
# Ran on commit d660f0f; `CLEAVE_MOE_GATE` and moe_gate were reverted after this run (docs/benchmarks.md).
# run 193 (one GPU): run 192 again with moe_gate's row loops unrolled (every float4 of a row in
# flight before its sum; the last block's writes likewise): the router stage (moe_gate against
# the three kernels it replaces), then decode steps fused against separate (`CLEAVE_MOE_GATE`),
# same binary: V2-Lite bf16, 30 V3 layers in AWQ with 64 routed experts, V2-Lite AWQ.
# `timeout 330 bash kernels/bench/run193-moe-gate2.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-193}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2bf --shape v2-lite; gen_model v2awq --shape v2-lite --dtype awq ) &
$C gen-checkpoint --config-only --shape v3-layers --layers 30 --routed-experts 64 --dtype awq --out /tmp/v3x30 > /dev/null
timeout 60 $C kernels-check --stages router > $OUT/run$R-router.txt 2>&1
echo "router rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-router.txt)"
grep -iE "fail|panic|over tol|error" $OUT/run$R-router.txt | head -5 | cut -c1-200
grep -E "^moe_gate  " $OUT/run$R-router.txt | cut -c1-150
BENCH_TIMEOUT=40 bench_steps v2bf-fused $C v2bf 1,2,4
BENCH_TIMEOUT=40 bench_steps v2bf-sep $C v2bf 1,2,4 CLEAVE_MOE_GATE=separate
for mode in fused separate; do
  CLEAVE_MOE_GATE=$mode timeout 100 $C kernels-check --no-ops --bench-model /tmp/v3x30 --load-format dummy --ctx 2048 \
    --batches 1,2 --prefill 0 > $OUT/run$R-v3x30-$mode.txt 2>&1
  echo "v3x30 $mode rc=$? $(( $(date +%s) - S )) s: $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run$R-v3x30-$mode.txt | grep -o '[0-9.]* ms' | tr '\n' ' ')"
done
BENCH_TIMEOUT=30 bench_steps v2awq-fused $C v2awq 1,2
BENCH_TIMEOUT=30 bench_steps v2awq-sep $C v2awq 1,2 CLEAVE_MOE_GATE=separate
for t in v2bf-fused v2bf-sep v3x30-fused v3x30-separate; do
  echo "$t b1: $(grep -hE 'profile decode batch 1:' $OUT/run$R-$t.txt | tr ',' '\n' | grep -E 'moe_gate|rms_norm|gemv_f32|route_align|kernels' | tr '\n' ' ' | cut -c1-250)"
done
for t in v2bf-fused v2bf-sep v3x30-fused v3x30-separate v2awq-fused v2awq-sep; do echo "$t: $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run$R-$t.txt | grep -o '[0-9.]* ms' | tr '\n' ' ')"; done
