#!/bin/bash
# run 67 (one GPU): the session's final binary: the quick pass (quant, qdecode, experts; golden
# fixtures; tiny-r1-awq and tiny-r1 with graphs vs eager), the qdecode stage at V2-Lite shapes,
# and four V3 layers in AWQ at batches 1, 16, 64.
source kernels/bench/lib.sh
$C gen-checkpoint --shape v3-layers --dtype awq --out /dev/shm/v3 > /dev/null 2>&1 &
GP=$!
for m in tiny-r1-awq tiny-r1; do
  timeout 200 $C kernels-check --quick --stages quant,qdecode,experts --golden models/golden --compare-model models/$m > $OUT/run67-quick-$m.txt 2>&1
  echo "quick $m rc=$?: $(tail -1 $OUT/run67-quick-$m.txt)"
  grep -iE "over tol|fail|panic|error" $OUT/run67-quick-$m.txt | grep -v "see note" | head -3
done
timeout 150 $C kernels-check --stages qdecode > $OUT/run67-qdecode.txt 2>&1
echo "qdecode rc=$?: $(tail -1 $OUT/run67-qdecode.txt)"
wait $GP
timeout 100 $C kernels-check --no-ops --bench-model /dev/shm/v3 --batches 1,16,64 --ctx 2048 --prefill 0 > $OUT/run67-v3-awq.txt 2>&1
echo "v3 awq rc=$?: $(grep 'CUDA graph:' $OUT/run67-v3-awq.txt | sed -E 's/.*step ([0-9.]+ ms) \(([0-9.]+% of HBM).*/\1 \2/' | tr '\n' ';')"
