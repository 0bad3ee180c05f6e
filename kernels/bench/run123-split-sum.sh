#!/bin/bash
# (Dropped after run 124: the in-GEMM sums and CLEAVE_SPLIT_SUM are gone; NOTES, "Tried and dropped:
# split-K sums inside the persistent compressed GEMM". Run now, the bench A/B line is stream-K.)
# run 123 (one GPU): split-K partials summed inside the persistent compressed GEMM (the last split
# of each item to finish) instead of a qgemm_reduce launch after it.
#   the qdecode stage: dense AWQ/FP8 linears and the stacked q/kv_a cut against the CPU, and the
#   in-GEMM sums against qgemm_reduce's bit for bit; the quick pass (golden fixtures, tiny-r1,
#   tiny-r1-awq: graphs vs eager); decode steps of V2-Lite AWQ and FP8 (batch 1/16/64) and four
#   V3 layers in AWQ with 64 experts (1/8/64): the graph step with the sums in the GEMM (default)
#   and by qgemm_reduce in one process; then the 61-layer V3 AWQ share at batch 1.
# `timeout 570 bash kernels/bench/run123-split-sum.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-123}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2awq --shape v2-lite --dtype awq; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64;
  gen_model v2fp8 --shape v2-lite --dtype fp8 ) &
timeout 150 $C kernels-check --stages qdecode > $OUT/run$R-qdecode.txt 2>&1
echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run$R-qdecode.txt)"
grep -E "split-K summed|^linear" $OUT/run$R-qdecode.txt | cut -c1-150 | head -40
grep -iE "over tol|fail|panic" $OUT/run$R-qdecode.txt | head -5 | cut -c1-170
quick_checks $R
for m in v2awq v2fp8 v3l4; do
  bt=1,16,64; [ $m = v3l4 ] && bt=1,8,64
  BENCH_TIMEOUT=100 bench_steps $m $C $m $bt
  grep -E "CUDA graph" $OUT/run$R-$m.txt | cut -c1-170
done
SHARE_END=560 share_steps 1
