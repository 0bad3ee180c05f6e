#!/bin/bash
# (Dropped after run 124: the in-GEMM sums and CLEAVE_SPLIT_SUM are gone; NOTES, "Tried and dropped:
# split-K sums inside the persistent compressed GEMM". Run now, the bench A/B line is stream-K.)
# run 124 (one GPU): run 123 again with the in-GEMM split-K sums limited to 8 rows and their loads
# in flight together (float4, eight splits at a time). Same checks, then decode steps of V2-Lite
# AWQ and FP8 and four V3 layers in AWQ at batch 1/4/8 (in the GEMM, the default, and by
# qgemm_reduce in one process), and the 61-layer V3 AWQ share at batch 1.
# `timeout 570 bash kernels/bench/run124-split-sum.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-124}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2awq --shape v2-lite --dtype awq; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64;
  gen_model v2fp8 --shape v2-lite --dtype fp8 ) &
timeout 150 $C kernels-check --stages qdecode > $OUT/run$R-qdecode.txt 2>&1
echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run$R-qdecode.txt)"
grep -E "split-K summed|^linear" $OUT/run$R-qdecode.txt | grep -v tiled | cut -c1-130 | head -40
grep -iE "over tol|fail|panic" $OUT/run$R-qdecode.txt | head -5 | cut -c1-170
quick_checks $R
for m in v2awq v2fp8 v3l4; do
  BENCH_TIMEOUT=100 bench_steps $m $C $m 1,4,8
  grep -E "CUDA graph" $OUT/run$R-$m.txt | cut -c1-150
done
SHARE_END=560 share_steps 1
