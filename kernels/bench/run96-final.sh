#!/bin/bash
# run 96 (one GPU): the session's final binary. The router's GEMV now also bounded by the bytes
# its row groups read (ROUTER_GEMV_MAX_READS: V2-Lite's gate up to 128 rows, V3's up to 8), so
# that V3's 7.3 MB gate is not re-read per group. Binaries: cleave-prev (5b631fb) and cleave.
#   checks: the quick pass (golden fixtures, tiny-r1, tiny-r1-awq), graphs vs eager.
#   steps:  four V3 layers in AWQ and bf16 V2-Lite, both binaries in the same run.
# `bash kernels/bench/run96-final.sh [RUN]`.
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-96}
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64; gen_model v2lite --shape v2-lite ) &
GP=$!
quick_checks $R
BENCH_TIMEOUT=60 bench_steps v3-prev $P v3l4 1,8,64
BENCH_TIMEOUT=60 bench_steps v3-new $C v3l4 1,8,64
BENCH_TIMEOUT=60 bench_steps v3-prev2 $P v3l4 1,8,64
BENCH_TIMEOUT=60 bench_steps v3-new2 $C v3l4 1,8,64
rm -rf /dev/shm/v3l4*
bench_steps v2-prev $P v2lite 1,16,64,128,256
bench_steps v2-new $C v2lite 1,16,64,128,256
wait $GP
rm -rf /dev/shm/v2lite*
