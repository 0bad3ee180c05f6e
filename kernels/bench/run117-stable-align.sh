#!/bin/bash
# run 117 (one GPU): moe_align's stable row order and stream-K for every AWQ expert batch.
#   the router stage: moe_align against its host reference, exactly (decode and prefill sizes,
#   all experts and one EP4 rank's share); the quick pass (golden fixtures, tiny-r1, tiny-r1-awq:
#   graphs vs eager); the qdecode stage (AWQ expert GEMMs against the CPU, stream-K default);
#   then whole decode steps of V2-Lite AWQ (batch 1/16/64/256) and four V3 layers in AWQ with 64
#   experts (1/8/64/256): the graph step with stream-K on (default) and off in one process, and
#   each graph's logits against the eager step's (equal since the stable order).
# `timeout 570 bash kernels/bench/run117-stable-align.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-117}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2awq --shape v2-lite --dtype awq; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
timeout 200 $C kernels-check --stages router > $OUT/run$R-router.txt 2>&1
echo "router rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run$R-router.txt)"
grep -E "moe_align" $OUT/run$R-router.txt | cut -c1-170 | head -30
grep -iE "over tol|fail|panic|error" $OUT/run$R-router.txt | head -5 | cut -c1-200
quick_checks $R
timeout 150 $C kernels-check --stages qdecode > $OUT/run$R-qdecode.txt 2>&1
echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run$R-qdecode.txt)"
grep -iE "over tol|fail|panic" $OUT/run$R-qdecode.txt | head -5 | cut -c1-170
for m in v2awq v3l4; do
  bt=1,16,64,256; [ $m = v3l4 ] && bt=1,8,64,256
  BENCH_TIMEOUT=100 bench_steps $m $C $m $bt
  grep -E "CUDA graph" $OUT/run$R-$m.txt | cut -c1-170
done
