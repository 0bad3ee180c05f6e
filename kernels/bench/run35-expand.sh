#!/bin/bash
# run 35 (one GPU), issue 15's batch-256 step over AWQ weights: the k-tile AWQ expansion
# (`qdequant_awq_tiles`) checked bit for bit against the reference and timed (`--stages quant`),
# then V2-Lite (AWQ, with a 4096-token prefill) and 4 V3 layers (AWQ) at batch 64 and 256.
source kernels/bench/lib.sh
timeout 200 $C kernels-check --stages quant > $OUT/run35-quant.txt 2>&1
echo "quant rc=$? failures: $(grep -ciE "fail" $OUT/run35-quant.txt)"; grep -iE "fail|error|panic" $OUT/run35-quant.txt | head -5
grep -E "^expand" $OUT/run35-quant.txt | sed -E 's/ +/ /g'
$C gen-checkpoint --shape v2-lite --dtype awq --out /dev/shm/lite > /dev/null 2>&1
$C gen-checkpoint --shape v3-layers --layers 4 --dtype awq --out /dev/shm/v3l4 > /dev/null 2>&1
timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/lite --batches 64,256 --prefill 4096 > $OUT/run35-lite.txt 2>&1
echo "lite rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ |prefill of|^ +[0-9]+ tokens" $OUT/run35-lite.txt | cut -c1-100
grep -oE "profile [a-z]+( batch [0-9]+)?|qdequant_awq[_a-z]* [0-9.]+ms/[0-9]+" $OUT/run35-lite.txt | paste -sd' '
timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 64,256 --prefill 0 > $OUT/run35-v3l4.txt 2>&1
echo "v3l4 rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ " $OUT/run35-v3l4.txt | cut -c1-80
grep -oE "profile [a-z]+( batch [0-9]+)?|qdequant_awq[_a-z]* [0-9.]+ms/[0-9]+" $OUT/run35-v3l4.txt | paste -sd' '
