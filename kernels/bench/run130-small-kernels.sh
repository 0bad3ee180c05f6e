#!/bin/bash
# run 130 (one GPU): the batch-1 small kernels' loads off their critical path. rms_norm_f32,
# moe_combine_norm and mla_prologue read their weights (and the step's inputs) before the PDL
# wait; moe_combine_norm loads the residual with the routes; mla_combine reads the row lengths
# before the wait and every used split in one round trip; mla_decode3 looks up its first tile
# and prefetches it into L2 before the wait. The quick pass, bf16 and AWQ V2-Lite steps against
# the build before ($P) (bf16 alternating, twice), and ncu's time of those kernels at batch 1.
# `timeout 570 bash kernels/bench/run130-small-kernels.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-130}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2lite --shape v2-lite; gen_model v2awq --shape v2-lite --dtype awq ) &
quick_checks $R
for i in 1 2; do
  for b in new prev; do
    bin=$C; [ $b = prev ] && bin=$P
    BENCH_TIMEOUT=60 bench_steps v2lite-$b$i $bin v2lite 1,4,64
  done
done
for b in new prev; do
  bin=$C; [ $b = prev ] && bin=$P
  BENCH_TIMEOUT=60 bench_steps v2awq-$b $bin v2awq 1,4,64
done
timeout 100 ncu --profile-from-start off --clock-control none --kernel-name regex:"mla_|rms_norm|moe_combine" \
  --metrics gpu__time_duration.sum --csv --print-units base \
  $C kernels-check --no-ops --bench-model /dev/shm/v2lite --ctx 1024 --batches 1 --prefill 0 > $OUT/run$R-ncu.csv 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s"
python3 kernels/bench/ncu_table.py $OUT/run$R-ncu.csv "new 1k x 1" 6
