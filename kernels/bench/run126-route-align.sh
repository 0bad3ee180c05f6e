#!/bin/bash
# run 126 (one GPU): routing and the expert sort for decode-sized batches without the 1,024-thread
# block: redux.sync top-k selection (and V3's eight group scores side by side) in route_token,
# and a one-warp sort for at most 32 assignments (no shared memory, no barriers).
#   the router stage: moe_route against the CPU, moe_align against its host reference, and
#   moe_route_align against moe_route and the reference, exactly; the quick pass; then decode
#   steps at batch 1 and 4 of bf16 and AWQ V2-Lite and four V3 layers in AWQ, this build ($C)
#   against the one before ($P) on the same GPU; the 61-layer V3 AWQ share at batch 1 if time
#   is left.
# `timeout 570 bash kernels/bench/run126-route-align.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-126}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2lite --shape v2-lite; gen_model v2awq --shape v2-lite --dtype awq;
  gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
timeout 150 $C kernels-check --stages router > $OUT/run$R-router.txt 2>&1
echo "router rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run$R-router.txt)"
grep -E "moe_route|moe_align" $OUT/run$R-router.txt | grep -E " 1 tokens| 3 tokens| 4 tokens|4096" | cut -c1-150
grep -iE "over tol|fail|panic|error" $OUT/run$R-router.txt | head -5 | cut -c1-200
quick_checks $R
for m in v2lite v2awq v3l4; do
  for b in new prev; do
    bin=$C; [ $b = prev ] && bin=$P
    BENCH_TIMEOUT=80 bench_steps $m-$b $bin $m 1,4
    grep -E "route_align" $OUT/run$R-$m-$b.txt | head -1 | grep -oE "moe_route_align [0-9.]+ms/[0-9]+"
  done
done
if [ $(( $(date +%s) - S )) -lt 330 ]; then
  share_steps 1
fi
