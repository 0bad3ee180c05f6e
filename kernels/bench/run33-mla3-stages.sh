#!/bin/bash
# run 33 (one GPU): MLA decode v3 with 2 or 3 pipeline stages and an 8-lanes-per-head softmax
# (issue 15): `kernels-check --stages attention` (every decode kernel against the CPU; timed rows
# printed as tag, shape, us, % of HBM), then whole decode steps of V2-Lite and 4 V3 layers (AWQ)
# under the default and under v2.
source kernels/bench/lib.sh
timeout 300 $C kernels-check --stages attention > $OUT/run33-attention.txt 2>&1
echo "attention rc=$? failures: $(grep -ciE "fail" $OUT/run33-attention.txt)"
grep -iE "fail|error|panic" $OUT/run33-attention.txt | head -5
grep -E "blocks per SM" $OUT/run33-attention.txt
grep -E "^mla_attention.*HBM$" $OUT/run33-attention.txt | sed -E 's/ +/ /g' \
  | awk '{s=""; for(i=3;i<=NF-7;i++) s=s" "$i; gsub(/ seqs, [0-9]+ rows,| rows checked|,/,"",s); printf "%-9s %-40s %8s %6s\n", $2, s, $(NF-4), $(NF-1)}'
$C gen-checkpoint --shape v2-lite --dtype awq --out /dev/shm/lite > /dev/null 2>&1
$C gen-checkpoint --shape v3-layers --layers 4 --dtype awq --out /dev/shm/v3l4 > /dev/null 2>&1
for m in ${MODES:-v3 v2}; do
  for mdl in lite v3l4; do
    CLEAVE_MLA_DECODE=$m timeout 100 $C kernels-check --no-ops --bench-model /dev/shm/$mdl --ctx 2048 --batches 1,64,256 --prefill 0 > $OUT/run33-$mdl-$m.txt 2>&1
    echo "$mdl $m rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ " $OUT/run33-$mdl-$m.txt | cut -c1-80
    grep -oE "profile decode batch [0-9]+|mla_decode[0-9a-z_]* [0-9.]+ms/[0-9]+" $OUT/run33-$mdl-$m.txt | paste -sd' '
  done
done
