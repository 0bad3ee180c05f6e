#!/bin/bash
# run 127 (one GPU): run 126's routing with every power-of-two group size reduced side by side
# (64 experts in 8 groups of 8, the V3-shaped bench models, not only V3/R1's groups of 32): the
# router stage (moe_route against the CPU with a 64-expert V3 case, moe_align and
# moe_route_align exactly), the quick pass, four V3 layers in AWQ at batch 1/4 against the build
# before run 126 ($P), and the 61-layer V3 AWQ share at batch 1.
# `timeout 570 bash kernels/bench/run127-group-lanes.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-127}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 &
timeout 150 $C kernels-check --stages router > $OUT/run$R-router.txt 2>&1
echo "router rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run$R-router.txt)"
grep -E "moe_route" $OUT/run$R-router.txt | grep -E " 1 tokens| 4 tokens|64 experts" | cut -c1-150
grep -iE "over tol|fail|panic|error" $OUT/run$R-router.txt | head -5 | cut -c1-200
quick_checks $R
for b in new prev; do
  bin=$C; [ $b = prev ] && bin=$P
  BENCH_TIMEOUT=80 bench_steps v3l4-$b $bin v3l4 1,4
  grep -oE "moe_route_align [0-9.]+ms/[0-9]+" $OUT/run$R-v3l4-$b.txt | head -1
done
share_steps 1
