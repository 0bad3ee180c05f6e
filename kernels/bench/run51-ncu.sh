#!/bin/bash
# run 51 (one GPU): the real GPU time of every kernel of one eager decode step (ncu, one metric,
# only the bench's profiled step: its profiler range), bf16 V2-Lite at batch 1/64/256 and four
# V3 layers in AWQ at batch 1/64, with the bench's own step times beside them.
source kernels/bench/lib.sh
S=$(date +%s)
NCU="ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --print-units base"
$C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1
$C gen-checkpoint --shape v3-layers --dtype awq --routed-experts 64 --out /dev/shm/v3awq > /dev/null 2>&1
echo "gen $(( $(date +%s) - S )) s"
for b in 1 64 256; do
  timeout 150 $NCU $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches $b --prefill 0 > $OUT/run51-ncu-v2lite-$b.csv 2>&1
  echo "ncu v2lite $b rc=$? $(( $(date +%s) - S )) s"
  python3 kernels/bench/ncu_table.py $OUT/run51-ncu-v2lite-$b.csv "bf16 V2-Lite batch $b" > $OUT/run51-v2lite-$b.txt
done
for b in 1 64; do
  timeout 150 $NCU $C kernels-check --no-ops --bench-model /dev/shm/v3awq --ctx 2048 --batches $b --prefill 0 > $OUT/run51-ncu-v3awq-$b.csv 2>&1
  echo "ncu v3awq $b rc=$? $(( $(date +%s) - S )) s"
  python3 kernels/bench/ncu_table.py $OUT/run51-ncu-v3awq-$b.csv "AWQ V3 4 layers batch $b" > $OUT/run51-v3awq-$b.txt
done
rm -rf /dev/shm/v2lite /dev/shm/v3awq
grep -h "CUDA graph\|decode batch" $OUT/run51-ncu-*.csv | cut -c1-200
cat $OUT/run51-v2lite-*.txt $OUT/run51-v3awq-*.txt
