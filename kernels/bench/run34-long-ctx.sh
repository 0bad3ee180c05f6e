#!/bin/bash
# run 34 (one GPU), issue 15: the final v3 MLA kernels checked (`--quick --stages attention`),
# V2-Lite (AWQ) decode steps at contexts 1k, 8k and 32k (item 4), then the real model's share
# (61 V3 layers in AWQ, 64 routed experts per layer: run 19's script) with MLA v3.
source kernels/bench/lib.sh
timeout 120 $C kernels-check --quick --stages attention > $OUT/run34-attention.txt 2>&1
echo "attention rc=$? failures: $(grep -ciE "fail" $OUT/run34-attention.txt) rows: $(grep -c "^mla_attention" $OUT/run34-attention.txt)"
$C gen-checkpoint --shape v2-lite --dtype awq --out /dev/shm/lite > /dev/null 2>&1
for cb in 1024:1,64,256 8192:1,64,256 32768:1,16,64; do
  ctx=${cb%%:*}; b=${cb#*:}
  timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/lite --ctx $ctx --batches $b --prefill 0 > $OUT/run34-lite-$ctx.txt 2>&1
  echo "lite ctx $ctx rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ " $OUT/run34-lite-$ctx.txt | cut -c1-80
  grep -oE "profile decode batch [0-9]+|mla_decode[0-9a-z_]* [0-9.]+ms/[0-9]+" $OUT/run34-lite-$ctx.txt | paste -sd' '
done
rm -rf /dev/shm/lite
bash kernels/bench/run19-v3-awq61.sh
mv $OUT/run19-bench.txt $OUT/run34-v3-awq61.txt
grep -oE "profile decode batch [0-9]+|mla_decode[0-9a-z_]* [0-9.]+ms/[0-9]+" $OUT/run34-v3-awq61.txt | paste -sd' '
