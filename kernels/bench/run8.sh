#!/bin/bash
# run 8 (nvidia-h200): the script of bench/results/run8-*.txt, the issue-7 record. Expects stripped
# release binaries in .carry/ (cargo build --release -p cleave -p cleave-bench). Every kernel
# against the CPU plus the golden checkpoints, the V2-Lite and 4-layer V3 decode/prefill
# benchmarks, and the PyTorch eager peer at the same context (1024) in the same run.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
export CLEAVE_KERNEL_CACHE=/tmp/cleave-kernels
C=.carry/cleave
chmod +x $C
({ time $C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite; } > $OUT/gen.txt 2>&1
 { time $C gen-checkpoint --shape v3-layers --out /dev/shm/v3l4; } >> $OUT/gen.txt 2>&1) &
GP=$!
S=$(date +%s)
timeout 200 $C kernels-check --golden models/golden --compare-model models/tiny-r1 > $OUT/ops.txt 2>&1; echo "ops rc=$? $(( $(date +%s) - S )) s"
wait $GP; grep real $OUT/gen.txt
S=$(date +%s)
timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/v2lite > $OUT/bench-v2lite.txt 2>&1; echo "bench v2-lite rc=$? $(( $(date +%s) - S )) s"
S=$(date +%s)
timeout 120 $C kernels-check --no-ops --bench-model /dev/shm/v3l4 > $OUT/bench-v3-4layers.txt 2>&1; echo "bench v3 rc=$? $(( $(date +%s) - S )) s"
rm -rf /dev/shm/v3l4
S=$(date +%s)
timeout 150 python3 kernels/bench/torch_peer.py --batches 1,64 --prompt 1024 > $OUT/torch-peer.txt 2>&1; echo "peer rc=$? $(( $(date +%s) - S )) s"
grep -E "FAIL|over tol|failed|rror" $OUT/ops.txt | head
grep -A12 "^golden" $OUT/ops.txt | head -14
for f in bench-v2lite bench-v3-4layers; do echo "== $f"; grep -E "^ +[0-9]+ +[0-9.]+ |allocations|enqueue|profile decode batch 64|^  [0-9.]+ ms, " $OUT/$f.txt | cut -c1-220; done
tail -3 $OUT/torch-peer.txt
