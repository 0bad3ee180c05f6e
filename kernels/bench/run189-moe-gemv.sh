#!/bin/bash
# run 189 (one GPU): bf16 experts at 1-4 tokens on the grouped GEMV (`CLEAVE_MOE_GEMV`, default 4)
# against the persistent tensor-core kernel (off), same binary: the quick pass, the experts stage
# (every grouped-GEMM variant, the GEMV both ways, 1-4096 tokens), V2-Lite bf16 steps at 1-16
# rows each way (and the GEMV up to 16 tokens).
# `timeout 570 bash kernels/bench/run189-moe-gemv.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-189}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2bf --shape v2-lite ) &
quick_checks $R
timeout 170 $C kernels-check --stages experts --default-variants > $OUT/run$R-experts.txt 2>&1
echo "experts rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-experts.txt)"
grep -iE "fail|panic|over tol|error" $OUT/run$R-experts.txt | head -5 | cut -c1-200
grep -E "gemv" $OUT/run$R-experts.txt | cut -c1-170 | head -12
wait
BENCH_TIMEOUT=50 bench_steps v2bf-gemv $C v2bf 1,2,4,8
BENCH_TIMEOUT=50 bench_steps v2bf-off $C v2bf 1,2,4,8 CLEAVE_MOE_GEMV=off
BENCH_TIMEOUT=50 bench_steps v2bf-gemv16 $C v2bf 8,16 CLEAVE_MOE_GEMV=16
for t in v2bf-gemv v2bf-off; do
  echo "$t b1 profile: $(grep -hE 'profile decode batch 1:' $OUT/run$R-$t.txt | tr ',' '\n' | grep -E 'gg|kernels' | tr '\n' ' ' | cut -c1-300)"
done
for t in v2bf-gemv v2bf-off v2bf-gemv16; do echo "$t: $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run$R-$t.txt | grep -o '[0-9.]* ms' | tr '\n' ' ')"; done
