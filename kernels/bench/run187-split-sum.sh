#!/bin/bash
# run 187 (one GPU): dense compressed GEMMs split over their input channels summing their own splits
# after a grid barrier (CLEAVE_QGEMM_SUM=fused, the default) against a qgemm_reduce launch
# (separate), same binary: the quick pass (both ways), V2-Lite AWQ and four V3 layers in AWQ at
# 1-16 rows, the 61-layer V3 share at batch 1 (one load each way).
# `timeout 560 bash kernels/bench/run187-split-sum.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-187}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2awq --shape v2-lite --dtype awq; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
$C gen-checkpoint --config-only --shape v3-layers --layers 61 --routed-experts 64 --dtype awq --out /tmp/v3x61 > /dev/null
quick_checks $R
grep -E "^quant_linear|^linear" $OUT/run$R-checks.txt | grep -E "split sum" | cut -c1-150 | head -4
wait
for mode in fused separate; do
  BENCH_TIMEOUT=45 bench_steps v2awq-$mode $C v2awq 1,4,16 CLEAVE_QGEMM_SUM=$mode
  BENCH_TIMEOUT=45 bench_steps v3l4-$mode $C v3l4 1,4,16 CLEAVE_QGEMM_SUM=$mode
done
for mode in fused separate; do
  f=$OUT/run$R-v3-61-$mode.txt
  CLEAVE_QGEMM_SUM=$mode timeout 240 $C kernels-check --no-ops --bench-model /tmp/v3x61 \
    --load-format dummy --ctx 2048 --batches 1 --prefill 0 > $f 2>&1
  echo "share $mode rc=$? $(( $(date +%s) - S )) s: $(grep -o 'CUDA graph: step [0-9.]* ms ([0-9.]*% of HBM' $f | head -1)"
  grep -oE "qgp8_awq_256_64_4_f32 [0-9.]+ms/[0-9]+|qgemm_reduce [0-9.]+ms/[0-9]+" $f | tr '\n' ' '; echo
done
