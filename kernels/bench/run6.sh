#!/bin/bash
# run 6 (nvidia-h200): the persistent grouped-GEMM sweep of bench/results/run6-tune.txt, which
# picked DEFAULT_PERSISTENT (engine/src/backend/cuda/variants.rs). Expects a stripped release
# `cleave` in .carry/. (run8.sh is the full issue-7 record.)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
export CLEAVE_KERNEL_CACHE=/tmp/cleave-kernels
chmod +x .carry/cleave
timeout 90 .carry/cleave kernels-check --stages moe_tune > $OUT/tune.txt 2>&1; echo "tune rc=$?"
grep -A20 "^moe_tune:" $OUT/tune.txt
