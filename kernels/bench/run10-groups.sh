#!/bin/bash
# run 10 (one GPU): parallel groups (issue 13). Expects the stripped release binary in .carry/.
# The experts with an expert-parallel half, the golden fixtures and tiny-r1 on CUDA through the
# new engine structure (a group of one), every parallel layout as rank threads on this GPU against
# one rank, a one-rank NCCL communicator, then the V2-Lite bf16 decode benchmark (NOBENCH=1 skips).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
export CLEAVE_KERNEL_CACHE=/tmp/cleave-kernels
C=.carry/cleave
chmod +x $C
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -z "$NOBENCH" ] && ({ time $C gen-checkpoint --shape v2-lite --dtype bf16 --out /dev/shm/v2lite; } > $OUT/gen.txt 2>&1) &
GP=$!
S=$(date +%s)
timeout 300 $C kernels-check --quick --stages experts --golden models/golden --compare-model models/tiny-r1 \
  --parallel-model models/golden/bf16-qlora > $OUT/checks.txt 2>&1; echo "checks rc=$? $(( $(date +%s) - S )) s"
grep -E "moe_experts|FAIL|over tol|failed|rror|panic" $OUT/checks.txt | cut -c1-180 | head -20
grep -A14 "^golden" $OUT/checks.txt | head -16
grep -A8 "^parallel groups" $OUT/checks.txt
tail -1 $OUT/checks.txt
$C generate --device cuda --prompt "What is 2+3?" --chat --max-tokens 40 2>&1 | tail -2
[ -n "$NOBENCH" ] && exit 0
wait $GP; grep -E "real|wrote" $OUT/gen.txt
S=$(date +%s)
timeout 200 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches ${BATCHES:-1,16,64,256} > $OUT/bench.txt 2>&1; echo "bench rc=$? $(( $(date +%s) - S )) s"
grep -E "loaded in|^ +[0-9]+ +[0-9.]+ |prefill" $OUT/bench.txt | cut -c1-200
