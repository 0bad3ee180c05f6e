#!/bin/bash
# run 133 (one GPU): run 131's build with the norms' weights brought into L2 before the wait
# instead of held in registers (run 132: V3's 1,024-thread moe_combine_norm blocks could not
# launch). The quick pass, bf16 V2-Lite and four V3 layers in AWQ against the build before ($P),
# and the 61-layer V3 AWQ share at batch 1.
# `timeout 330 bash kernels/bench/run133-final.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-133}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2lite --shape v2-lite; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
quick_checks $R
for b in new prev; do
  bin=$C; [ $b = prev ] && bin=$P
  BENCH_TIMEOUT=40 bench_steps v2lite-$b $bin v2lite 1,4,64
done
for b in new prev; do
  bin=$C; [ $b = prev ] && bin=$P
  BENCH_TIMEOUT=40 bench_steps v3l4-$b $bin v3l4 1,4,64
done
SHARE_END=325 share_steps 1
