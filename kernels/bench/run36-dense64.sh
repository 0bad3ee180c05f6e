#!/bin/bash
# run 36 (one GPU), issue 12 (the shape was reverted after it: kernels/NOTES.md): dense AWQ
# linears of 64 rows with 128-column items (qgp64 128/64/4,
# half the activation re-reads of 64/64/4): `kernels-check --stages qgemm_tune` (every shape
# checked against the tiled kernel and timed; the summary lines of 64-row dense AWQ cases), then
# four V3 layers (AWQ) at batch 64 under the default and with the dense shape forced.
source kernels/bench/lib.sh
timeout 330 $C kernels-check --stages qgemm_tune > $OUT/run36-tune.txt 2>&1
echo "tune rc=$? failures: $(grep -ciE "fail" $OUT/run36-tune.txt)"; grep -iE "fail|error|panic" $OUT/run36-tune.txt | head -3
grep -E "^  awq g(64|128) .* (16|64) rows" $OUT/run36-tune.txt | grep -vE "expert" | cut -c1-170
grep -E "^qgp awq g64 64x" $OUT/run36-tune.txt | sed -E 's/ +/ /g' | cut -c1-120
$C gen-checkpoint --shape v3-layers --layers 4 --dtype awq --out /dev/shm/v3l4 > /dev/null 2>&1
for q in persistent persistent:64x128/64/4; do
  CLEAVE_QGEMM=$q timeout 100 $C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 64 --prefill 0 > $OUT/run36-v3l4-${q//[:\/]/_}.txt 2>&1
  echo "v3l4 $q rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ " $OUT/run36-v3l4-${q//[:\/]/_}.txt | cut -c1-80
  grep -oE "qgp64_awq[0-9a-z_]* [0-9.]+ms/[0-9]+" $OUT/run36-v3l4-${q//[:\/]/_}.txt | paste -sd' '
done
