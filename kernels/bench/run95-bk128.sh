#!/bin/bash
# run 95 (one GPU): the bf16 persistent grouped GEMM with 128-channel k-tiles (each expert weight
# row read 256 bytes at a time where BK 64 reads 128): ggp32_128_3, ggp16_128_4 (16-row tiles)
# and ggpr32_32_128_2 (32-row tiles) against the defaults (32/64/6 and 32x64/64/3), one binary.
#   checks: the full experts stage (against the CPU) with both new default candidates forced.
#   steps:  bf16 V2-Lite, batches 1/16/64 per 16-row shape, 256 per 32-row shape.
# `bash kernels/bench/run95-bk128.sh [RUN]`.
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-95}
( gen_model v2lite --shape v2-lite ) &
GP=$!
CLEAVE_MOE_GEMM=persistent:32/128/3/0 CLEAVE_MOE_ROWS32=32x32/128/2/0 timeout 200 $C kernels-check --stages experts > $OUT/run${R}-experts.txt 2>&1
echo "experts (32/128/3, 32x32/128/2) rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-experts.txt)"
grep -E "over tol" $OUT/run${R}-experts.txt | cut -c1-150 | head
CLEAVE_MOE_GEMM=persistent:16/128/4/0 timeout 100 $C kernels-check --quick --stages experts > $OUT/run${R}-experts16.txt 2>&1
echo "experts quick (16/128/4) rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-experts16.txt)"
bench_steps def $C v2lite 1,16,64,256
bench_steps bk128 $C v2lite 1,16,64 CLEAVE_MOE_GEMM=persistent:32/128/3/0
bench_steps bn16 $C v2lite 1,16,64 CLEAVE_MOE_GEMM=persistent:16/128/4/0
bench_steps r32 $C v2lite 256 CLEAVE_MOE_ROWS32=32x32/128/2/0
bench_steps def2 $C v2lite 1,16,64,256
bench_steps bk128b $C v2lite 1,16,64 CLEAVE_MOE_GEMM=persistent:32/128/3/0
grep -h "step ms by" $OUT/run${R}-def.txt | cut -c1-400
wait $GP
rm -rf /dev/shm/v2lite*
