#!/bin/bash
# run 65 (one GPU): where 8-row AWQ expert tiles pay, in whole decode steps (CUDA graphs):
# CLEAVE_QGEMM_ROWS8 = off (16-row tiles), 4 (the default), 16 (8-row tiles up to 16 rows per
# expert on average) on four V3 layers with 64 routed experts (the real model's per-GPU MoE
# shape under 4-way expert parallelism) and on V2-Lite, both AWQ g64.
source kernels/bench/lib.sh
( $C gen-checkpoint --shape v3-layers --routed-experts 64 --dtype awq --out /dev/shm/v3e64 > /dev/null 2>&1
  $C gen-checkpoint --shape v2-lite --dtype awq --out /dev/shm/lite > /dev/null 2>&1 ) &
GP=$!
timeout 150 $C kernels-check --quick --stages quant,qdecode --golden models/golden --compare-model models/tiny-r1-awq > $OUT/run65-quick.txt 2>&1
echo "quick rc=$?: $(tail -1 $OUT/run65-quick.txt)"
wait $GP
for m in v3e64:16,64,128:2048 lite:16,64:1024; do
  IFS=: read name batches ctx <<< "$m"
  for r in off 4 16; do
    CLEAVE_QGEMM_ROWS8=$r timeout 100 $C kernels-check --no-ops --bench-model /dev/shm/$name --batches $batches --ctx $ctx --prefill 0 > $OUT/run65-$name-$r.txt 2>&1
    echo "$name rows8=$r rc=$?: $(grep 'CUDA graph:' $OUT/run65-$name-$r.txt | sed -E 's/.*step ([0-9.]+ ms) \(([0-9.]+% of HBM).*/\1 \2/' | tr '\n' ';')"
  done
done
