#!/bin/bash
# run 185 (one GPU): MoE down GEMMs (bf16 gg_persistent, compressed qg_persistent) reading their
# expert tiles and sending for their first weights into L2 before the PDL wait (the tiles were
# written two launches back), this build against run 184's ($P): the quick pass, the experts and
# quant stages, V2-Lite bf16 and AWQ and four V3 layers in AWQ at 1-64 rows with both builds.
# `timeout 570 bash kernels/bench/run185-down-early.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-185}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2bf --shape v2-lite; gen_model v2awq --shape v2-lite --dtype awq
  gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
quick_checks $R
f=$OUT/run$R-stages.txt
timeout 150 $C kernels-check --stages experts,quant --default-variants > $f 2>&1
echo "stages rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $f)"; grep -iE "fail|panic|over tol" $f | head -5 | cut -c1-200
wait
BENCH_TIMEOUT=45 ab_steps v2bf 1,4,16,64
BENCH_TIMEOUT=45 ab_steps v2awq 1,4,16,64
BENCH_TIMEOUT=45 ab_steps v3l4 1,4,16,64
BENCH_TIMEOUT=45 bench_steps v2bf-new2 $C v2bf 1,4,16,64
BENCH_TIMEOUT=45 bench_steps v2bf-prev2 $P v2bf 1,4,16,64
for t in v2bf-new v2bf-prev v2bf-new2 v2bf-prev2 v2awq-new v2awq-prev v3l4-new v3l4-prev; do echo "$t: $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run$R-$t.txt | grep -o '[0-9.]* ms' | tr '\n' ' ')"; done
