#!/bin/bash
# run 131 (one GPU): run 130's build with mla_combine in three instances by split count (8, 16,
# 64 held in registers; run 130's single 64-split instance made batch 64 7% slower). The quick
# pass, bf16 V2-Lite steps at 1/4/16/64 and AWQ at 1/64 against the build before ($P), and ncu's
# time of the changed kernels at batch 64 for both builds.
# `timeout 570 bash kernels/bench/run131-small-kernels.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-131}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2lite --shape v2-lite; gen_model v2awq --shape v2-lite --dtype awq ) &
quick_checks $R
for b in new prev; do
  bin=$C; [ $b = prev ] && bin=$P
  BENCH_TIMEOUT=60 bench_steps v2lite-$b $bin v2lite 1,4,16,64
done
for b in new prev; do
  bin=$C; [ $b = prev ] && bin=$P
  BENCH_TIMEOUT=60 bench_steps v2awq-$b $bin v2awq 1,64
done
for b in new prev; do
  bin=$C; [ $b = prev ] && bin=$P
  timeout 60 ncu --profile-from-start off --clock-control none --kernel-name regex:"mla_|rms_norm|moe_combine" \
    --metrics gpu__time_duration.sum --csv --print-units base \
    $bin kernels-check --no-ops --bench-model /dev/shm/v2lite --ctx 1024 --batches 64 --prefill 0 > $OUT/run$R-ncu-$b.csv 2>&1
  echo "ncu $b rc=$? $(( $(date +%s) - S )) s"
  python3 kernels/bench/ncu_table.py $OUT/run$R-ncu-$b.csv "$b 1k x 64" 6
done
