#!/bin/bash
# run 180 (one GPU): where the batch-1 and batch-64 steps go, by each kernel's own time: the
# eager profiles (every kernel listed) with programmatic dependent launch off (CLEAVE_PDL=off; with
# it, a kernel's time includes its wait for the one before) for the 61-layer V3 AWQ share at
# batches 1 and 64 and V2-Lite bf16 at batch 1, beside V2-Lite's default step. HEAD's kernels.
# `timeout 570 bash kernels/bench/run180-own-times.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-180}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v2bf --shape v2-lite &
[ -d /tmp/v3x61 ] || $C gen-checkpoint --config-only --shape v3-layers --layers 61 --routed-experts 64 --dtype awq --out /tmp/v3x61 > /dev/null
f=$OUT/run$R-v3-61-nopdl.txt
CLEAVE_PDL=off timeout 300 $C kernels-check --no-ops --bench-model /tmp/v3x61 --load-format dummy --ctx 2048 --batches 1,64 --prefill 0 > $f 2>&1
echo "v3-61 nopdl rc=$? $(( $(date +%s) - S )) s"
grep -E "CUDA graph" $f | cut -c1-150
wait
BENCH_TIMEOUT=60 bench_steps v2bf-nopdl $C v2bf 1 CLEAVE_PDL=off
BENCH_TIMEOUT=60 bench_steps v2bf $C v2bf 1
for x in v3-61-nopdl v2bf-nopdl v2bf; do echo "== $x"; grep -E "profile decode batch" $OUT/run$R-$x.txt | cut -c1-2500; done
