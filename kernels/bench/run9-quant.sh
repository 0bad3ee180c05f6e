#!/bin/bash
# run 9 (one GPU): compressed weights (issue 12). Expects the stripped release binary in .carry/.
# The quant kernels against the CPU, the golden fixtures (AWQ included) at f32 and bf16, then the
# V2-Lite decode/prefill benchmark in bf16, FP8 and AWQ from checkpoints made in the same run.
# NOBENCH=1: checks only; NOOPS=1: benchmarks only; GOLDEN=1 adds the golden fixtures and the
# tiny-r1-awq accuracy on CUDA; STAGES, DTYPES and BATCHES narrow the run.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
export CLEAVE_KERNEL_CACHE=/tmp/cleave-kernels
C=.carry/cleave
chmod +x $C
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -z "$NOBENCH" ] && (for d in ${DTYPES:-bf16 fp8 awq}; do { time $C gen-checkpoint --shape v2-lite --dtype $d --out /dev/shm/v2lite-$d; } >> $OUT/gen.txt 2>&1; done) &
GP=$!
if [ -z "$NOOPS" ]; then
S=$(date +%s)
timeout 240 $C kernels-check ${QUICK:+--quick} --stages ${STAGES:-quant,linear,experts} ${GOLDEN:+--golden models/golden --compare-model models/tiny-r1-awq} > $OUT/ops.txt 2>&1; echo "ops rc=$? $(( $(date +%s) - S )) s"
grep -E "quant|linear|moe_experts|FAIL|over tol|failed|rror|panic" $OUT/ops.txt | cut -c1-200 | head -70
grep -A14 "^golden" $OUT/ops.txt | head -16
S=$(date +%s)
[ -n "$GOLDEN" ] && timeout 100 python3 models/tiny-r1/eval_cleave.py --cleave $C --model models/tiny-r1-awq --device cuda --limit 200 --jobs 8 > $OUT/tiny-awq-cuda.txt 2>&1; echo "tiny-r1-awq cuda rc=$? $(( $(date +%s) - S )) s"; tail -1 $OUT/tiny-awq-cuda.txt
fi
[ -n "$NOBENCH" ] && exit 0
wait $GP; grep -E "real|wrote" $OUT/gen.txt
for d in ${DTYPES:-bf16 fp8 awq}; do
  S=$(date +%s)
  timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/v2lite-$d --batches ${BATCHES:-1,16,64,256} > $OUT/bench-$d.txt 2>&1; echo "bench $d rc=$? $(( $(date +%s) - S )) s"
  grep -E "loaded in|^ +[0-9]+ +[0-9.]+ |allocations|prefill|profile decode batch 64" $OUT/bench-$d.txt | cut -c1-200
  rm -rf /dev/shm/v2lite-$d
done
# Four layers of the V3 shape (256 experts) compressed, context 2048 (V3=0 skips).
[ -n "$NOV3" ] && exit 0
for d in ${V3DTYPES:-awq fp8}; do
  $C gen-checkpoint --shape v3-layers --dtype $d --out /dev/shm/v3l4-$d > /dev/null 2>&1
  S=$(date +%s)
  timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/v3l4-$d --ctx 2048 --batches 1,64,256 > $OUT/bench-v3l4-$d.txt 2>&1; echo "bench v3l4 $d rc=$? $(( $(date +%s) - S )) s"
  grep -E "loaded in|^ +[0-9]+ +[0-9.]+ |prefill|profile decode batch 64" $OUT/bench-v3l4-$d.txt | cut -c1-200
  rm -rf /dev/shm/v3l4-$d
done
