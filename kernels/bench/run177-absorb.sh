#!/bin/bash
# run 177 (one GPU): MLA's absorbed projections (q_lat = q_nope W_UK, out = o_lat W_UV^T) at 1-4
# rows on per-head GEMV kernels (gemv.cu `mla_absorb_*`) instead of cuBLAS's batched GEMM, against
# run 175's build ($P). The quick pass (its attention stage compares few-row steps, V3's 128 heads
# among them, with the CPU), V2-Lite bf16 and AWQ at batches 1 and 4 with both builds, then the
# 61-layer V3 share at batches 1 and 4 with this build and, time allowing, batch 1 with $P.
# `timeout 570 bash kernels/bench/run177-absorb.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-177}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2bf --shape v2-lite; gen_model v2awq --shape v2-lite --dtype awq ) &
quick_checks $R
grep -E "^mla_attention.*(few rows|V3 heads)" $OUT/run$R-checks.txt | cut -c1-150 | head -12
wait
BENCH_TIMEOUT=40 ab_steps v2bf 1,4
BENCH_TIMEOUT=40 ab_steps v2awq 1,4
for m in v2bf v2awq; do for t in new prev; do
  echo "== $m $t"; grep -hE "profile decode batch 1:" $OUT/run$R-$m-$t.txt | grep -oE "(kernels [0-9.]+ ms|cublas batched gemm [0-9.]+ms/[0-9]+|mla_absorb_u[kv]_r[14] [0-9.]+ms/[0-9]+)" | tr '\n' ' '; echo
done; done
SHARE_END=420 share_steps 1,4
grep -hE "profile decode batch 1:" $OUT/run$R-v3-61.txt | grep -oE "(kernels [0-9.]+ ms|cublas batched gemm [0-9.]+ms/[0-9]+|mla_absorb_u[kv]_r[14] [0-9.]+ms/[0-9]+)" | tr '\n' ' '; echo
if [ $(( $(date +%s) - S )) -lt 390 ]; then
  timeout $(( 565 - ($(date +%s) - S) )) $P kernels-check --no-ops --bench-model /tmp/v3x61 --load-format dummy --ctx 2048 \
    --batches 1 --prefill 0 > $OUT/run$R-v3-61-prev.txt 2>&1
  echo "v3-61 prev rc=$? $(( $(date +%s) - S )) s"; grep -E "CUDA graph:" $OUT/run$R-v3-61-prev.txt | cut -c1-150
fi
