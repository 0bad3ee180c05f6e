#!/bin/bash
# run 175 (one GPU): run 174's half tiles only for expert stacks of at least 512 MiB
# (HALVES_MIN_BYTES; V2-Lite's 0.29 GB stacks were slower with them). The quick pass, four V3
# layers (1.4 GB stacks: half tiles on) and V2-Lite in AWQ (off), each step also replayed with the
# half tiles off / on at any size in the same process; V2-Lite at batch 64 with 8-row tiles for
# every expert (CLEAVE_QGEMM_ROWS8=8); then the 61-layer V3 share at batches 1 and 64.
# `timeout 570 bash kernels/bench/run175-halves-bytes.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-175}
nvidia-smi --query-gpu=name --format=csv,noheader
awq_models_gen
quick_checks $R
wait
BENCH_TIMEOUT=60 bench_steps v3l4 $C v3l4 1,16,64
BENCH_TIMEOUT=60 bench_steps v2awq $C v2awq 1,16,64,256
BENCH_TIMEOUT=40 bench_steps v2awq-rows8 $C v2awq 64 CLEAVE_QGEMM_ROWS8=8
grep -hE "CUDA graph" $OUT/run$R-v3l4.txt $OUT/run$R-v2awq.txt $OUT/run$R-v2awq-rows8.txt | cut -c1-150
SHARE_END=565 share_steps 1,64
share_profile "1|64"
