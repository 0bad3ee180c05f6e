#!/bin/bash
# Ran on commit 2a29eb1; `CLEAVE_MOE_GATE` and moe_gate were reverted after run 193 (docs/benchmarks.md).
# run 192 (one GPU): a MoE layer's entry at 1-4 tokens in one kernel (`moe_gate`: the
# post-attention residual add and RMSNorm, the f32 router GEMV, routing and the one-warp sort)
# against the three kernels it replaces (`CLEAVE_MOE_GATE=separate`), same binary: the quick pass
# (graphs against eager on every model), the router stage (moe_gate against the separate kernels
# at 1-4 tokens), then decode steps both ways: V2-Lite bf16 and AWQ, four V3 layers in AWQ, and
# 30 V3 layers in AWQ with 64 routed experts (dummy weights; the 61-layer share needs an H200).
# `timeout 570 bash kernels/bench/run192-moe-gate.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-192}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2bf --shape v2-lite; gen_model v2awq --shape v2-lite --dtype awq; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
$C gen-checkpoint --config-only --shape v3-layers --layers 30 --routed-experts 64 --dtype awq --out /tmp/v3x30 > /dev/null
quick_checks $R
timeout 60 $C kernels-check --stages router > $OUT/run$R-router.txt 2>&1
echo "router rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-router.txt)"
grep -iE "fail|panic|over tol|error" $OUT/run$R-router.txt | head -5 | cut -c1-200
grep -E "^moe_gate" $OUT/run$R-router.txt | cut -c1-150
for m in v2bf v2awq v3l4; do
  BENCH_TIMEOUT=40 bench_steps $m-fused $C $m 1,2,4
  BENCH_TIMEOUT=40 bench_steps $m-sep $C $m 1,2,4 CLEAVE_MOE_GATE=separate
done
for mode in fused separate; do
  CLEAVE_MOE_GATE=$mode timeout 100 $C kernels-check --no-ops --bench-model /tmp/v3x30 --load-format dummy --ctx 2048 \
    --batches 1,2 --prefill 0 > $OUT/run$R-v3x30-$mode.txt 2>&1
  echo "v3x30 $mode rc=$? $(( $(date +%s) - S )) s: $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run$R-v3x30-$mode.txt | grep -o '[0-9.]* ms' | tr '\n' ' ')"
done
for t in v2bf-fused v2bf-sep v3x30-fused v3x30-separate; do
  echo "$t b1: $(grep -hE 'profile decode batch 1:' $OUT/run$R-$t.txt | tr ',' '\n' | grep -E 'moe_gate|rms_norm|gemv_f32|route_align|kernels' | tr '\n' ' ' | cut -c1-250)"
done
for t in v2bf-fused v2bf-sep v2awq-fused v2awq-sep v3l4-fused v3l4-sep v3x30-fused v3x30-separate; do echo "$t: $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run$R-$t.txt | grep -o '[0-9.]* ms' | tr '\n' ' ')"; done
