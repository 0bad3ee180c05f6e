#!/bin/bash
# run 125 (one GPU): the real GPU time of every kernel of one eager decode step at batch 1 (ncu,
# one metric, the bench's profiled step only), as run 51 did before the fusions of runs 79-96:
# bf16 and AWQ V2-Lite, four V3 layers in AWQ with 64 experts; with the graph steps beside them.
# `timeout 570 bash kernels/bench/run125-ncu-b1.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-125}
NCU="ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --print-units base"
( gen_model v2lite --shape v2-lite; gen_model v2awq --shape v2-lite --dtype awq;
  gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
for m in v2lite v2awq v3l4; do
  while [ ! -f /dev/shm/$m.done ]; do sleep 1; done
  ctx=1024; [ $m = v3l4 ] && ctx=2048
  timeout 170 $NCU $C kernels-check --no-ops --bench-model /dev/shm/$m --ctx $ctx --batches 1 --prefill 0 > $OUT/run$R-ncu-$m.csv 2>&1
  echo "ncu $m rc=$? $(( $(date +%s) - S )) s"
  python3 kernels/bench/ncu_table.py $OUT/run$R-ncu-$m.csv "$m batch 1" 40 > $OUT/run$R-$m.txt
  grep -h "CUDA graph" $OUT/run$R-ncu-$m.csv | cut -c1-120
  cat $OUT/run$R-$m.txt
done
