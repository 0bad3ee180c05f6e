#!/bin/bash
# run 6 (nvidia-h200): the script of bench/results/run6-*.txt; expects stripped release binaries
# in .carry/ (cargo build --release -p cleave -p cleave-bench). Every kernel against the CPU, the
# golden checkpoints, the persistent grouped-GEMM sweep, and the V2-Lite decode/prefill benchmark.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
export CLEAVE_KERNEL_CACHE=/tmp/cleave-kernels
C=.carry/cleave
chmod +x $C
(time $C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite) > $OUT/gen.txt 2>&1 &
GP=$!
S=$(date +%s)
timeout 230 $C kernels-check --golden models/golden --compare-model models/tiny-r1 > $OUT/ops.txt 2>&1; echo "ops rc=$? $(( $(date +%s) - S )) s"
S=$(date +%s)
timeout 90 $C kernels-check --stages moe_tune > $OUT/tune.txt 2>&1; echo "tune rc=$? $(( $(date +%s) - S )) s"
wait $GP; tail -3 $OUT/gen.txt
S=$(date +%s)
timeout 200 $C kernels-check --no-ops --bench-model /dev/shm/v2lite > $OUT/bench.txt 2>&1; echo "bench rc=$? $(( $(date +%s) - S )) s"
grep -E "FAIL|over tol|failed|Error|error" $OUT/ops.txt | head -20
grep -E "ggp|no-ggp" $OUT/ops.txt | head -12
grep -A12 "^golden" $OUT/ops.txt | head -14
grep -A20 "^moe_tune:" $OUT/tune.txt
grep -v "^ *[0-9]*: \|Stack" $OUT/bench.txt | grep -vE "^\s+[a-z_0-9]+\s+[0-9.]+ ms" | tail -40
