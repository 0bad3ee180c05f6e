#!/bin/bash
# run 181 (one GPU): at one row, W_UV's kernel also writes the output projection's bf16 operand
# (no cast_f32_bf16 launch a layer in AWQ/FP8 steps), and the absorb kernels lose their row
# template (one row only). Against run 178's build ($P): the quick pass, V2-Lite bf16 and AWQ and
# four V3 layers in AWQ at batch 1 with both builds; four V3 layers at batch 1 with each MLA
# decode kernel at 128 heads (CLEAVE_MLA_DECODE=v3:16|v3:32|v3:64 against the default v4); the
# 61-layer V3 share at batch 1 (run 178: 11.982 ms).
# `timeout 570 bash kernels/bench/run181-absorb-bf16.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-181}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2bf --shape v2-lite; gen_model v2awq --shape v2-lite --dtype awq
  gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
quick_checks $R
grep -E "^mla_attention auto.*(few rows|V3 heads)" $OUT/run$R-checks.txt | cut -c1-150 | head -4
wait
BENCH_TIMEOUT=40 ab_steps v2bf 1
BENCH_TIMEOUT=40 ab_steps v2awq 1
BENCH_TIMEOUT=40 ab_steps v3l4 1
for h in 16 32 64; do BENCH_TIMEOUT=40 bench_steps v3l4-v3h$h $C v3l4 1 CLEAVE_MLA_DECODE=v3:$h; done
for x in v2bf-new v2bf-prev v2awq-new v2awq-prev v3l4-new v3l4-prev v3l4-v3h16 v3l4-v3h32 v3l4-v3h64; do
  echo "== $x $(grep -hE "profile decode batch 1:" $OUT/run$R-$x.txt | tr ',' '\n' | grep -E "kernels|absorb|cast|mla_" | tr '\n' ' ')"
done
SHARE_END=560 share_steps 1
share_profile 1
grep -hE "profile decode batch 1:" $OUT/run$R-v3-61.txt | tr ',' '\n' | grep -E "absorb|cast|mla_" | tr '\n' ' '; echo
