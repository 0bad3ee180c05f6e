#!/bin/bash
# run 184 (one GPU): MLA decode's split combine inside the decode kernel (v3 and v4 behind a grid
# barrier, CLEAVE_MLA_COMBINE=fused, the default) against a mla_combine launch of its own
# (separate), same binary: the quick pass (both ways), the attention stage (every decode shape),
# V2-Lite bf16 and four V3 layers in AWQ at 1-64 rows each way, the 61-layer V3 share at batch 1.
# `timeout 570 bash kernels/bench/run184-mla-join.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-184}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2bf --shape v2-lite; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
quick_checks $R
grep -E "^mla_attention" $OUT/run$R-checks.txt | grep -E "one row|few rows|combine" | cut -c1-150 | head -8
attention_check fused
wait
BENCH_TIMEOUT=45 bench_steps v2bf-fused $C v2bf 1,2,4,16,64
BENCH_TIMEOUT=45 bench_steps v2bf-sep $C v2bf 1,2,4,16,64 CLEAVE_MLA_COMBINE=separate
BENCH_TIMEOUT=45 bench_steps v3l4-fused $C v3l4 1,2,4,8,16,32
BENCH_TIMEOUT=45 bench_steps v3l4-sep $C v3l4 1,2,4,8,16,32 CLEAVE_MLA_COMBINE=separate
SHARE_END=560 share_steps 1
grep -hE "profile decode batch 1:" $OUT/run$R-v3-61.txt | tr ',' '\n' | grep -E "kernels|mla_" | tr '\n' ' '; echo
for t in v2bf-fused v2bf-sep v3l4-fused v3l4-sep; do echo "$t: $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run$R-$t.txt | grep -o '[0-9.]* ms' | tr '\n' ' ')"; done
