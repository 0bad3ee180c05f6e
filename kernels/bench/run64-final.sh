#!/bin/bash
# run 64 (one GPU), the final binary of runs 62-63:
#   checks: the quick pass (quant, qdecode, experts; golden fixtures; tiny-r1-awq with graphs vs eager)
#   v3-61:  the real model's decode, one GPU's share (run 19's script: 61 V3 layers in AWQ g64, 64
#           routed experts per layer, context 2048), batches 1, 64, 128.
source kernels/bench/lib.sh
if [ "$1" = checks ]; then
  S=$(date +%s)
  timeout 250 $C kernels-check --quick --stages quant,qdecode,experts --golden models/golden --compare-model models/tiny-r1-awq > $OUT/run64-quick.txt 2>&1
  echo "quick rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run64-quick.txt)"
  grep -iE "over tol|fail|panic|error" $OUT/run64-quick.txt | grep -v "see note" | head -5
  grep -E "graphs vs eager" $OUT/run64-quick.txt | cut -c1-120 | head -12
fi
if [ "$1" = v3-61 ]; then
  BATCHES=1,64,128 bash kernels/bench/run19-v3-awq61.sh
  cp $OUT/run19-bench.txt $OUT/run64-v3-awq61.txt && rm $OUT/run19-bench.txt
fi
