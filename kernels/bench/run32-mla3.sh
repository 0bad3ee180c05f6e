#!/bin/bash
# run 32 (one GPU): MLA decode v3 (issue 15): `kernels-check --stages attention` (every MLA decode
# kernel against the CPU, timed at V2-Lite's 16 and V3's 128 heads), then whole decode steps with
# v3 (default) and v2: V2-Lite in AWQ, and 4 layers of the V3 shape in AWQ at context 2048.
source kernels/bench/lib.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 240 $C kernels-check --stages attention > $OUT/run32-attention.txt 2>&1
echo "attention rc=$?"
grep -E "blocks per SM" $OUT/run32-attention.txt
grep -E "^mla_attention" $OUT/run32-attention.txt | sed -E 's/, [0-9]+ rows checked//; s/ seqs, [0-9]+ rows,/s/; s/ +/ /g; s/mla_attention //' | cut -c1-100
echo "failures: $(grep -ciE "fail" $OUT/run32-attention.txt)"; grep -iE "fail|error|panic" $OUT/run32-attention.txt | head -5
$C gen-checkpoint --shape v2-lite --dtype awq --out /dev/shm/lite > /dev/null 2>&1
$C gen-checkpoint --shape v3-layers --layers 4 --dtype awq --out /dev/shm/v3l4 > /dev/null 2>&1
for m in v3 v2; do
  CLEAVE_MLA_DECODE=$m timeout 100 $C kernels-check --no-ops --bench-model /dev/shm/lite --batches 1,64,256 --prefill 0 > $OUT/run32-lite-$m.txt 2>&1
  echo "lite $m rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ " $OUT/run32-lite-$m.txt | cut -c1-80
  grep -oE "profile decode batch [0-9]+|mla_decode[0-9a-z_]* [0-9.]+ms/[0-9]+" $OUT/run32-lite-$m.txt | paste -sd' '
  CLEAVE_MLA_DECODE=$m timeout 100 $C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 1,64,256 --prefill 0 > $OUT/run32-v3l4-$m.txt 2>&1
  echo "v3l4 $m rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ " $OUT/run32-v3l4-$m.txt | cut -c1-80
  grep -oE "profile decode batch [0-9]+|mla_decode[0-9a-z_]* [0-9.]+ms/[0-9]+" $OUT/run32-v3l4-$m.txt | paste -sd' '
done
