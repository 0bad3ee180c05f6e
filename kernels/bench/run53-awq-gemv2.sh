#!/bin/bash
# run 53 (one GPU): the AWQ GEMV with every load of a chunk issued one chunk ahead (run 52's
# version loaded zero points and x inside the unit loop and ran at half the persistent GEMM's
# speed). Quick checks, the quant stage's AWQ linears, four V3 layers in AWQ at batch 1/8/64 with
# the GEMV (default) and without (CLEAVE_AWQ_GEMV=off), same run.
source kernels/bench/lib.sh
S=$(date +%s)
$C gen-checkpoint --shape v3-layers --dtype awq --routed-experts 64 --out /dev/shm/v3l4 > /dev/null 2>&1 &
GP=$!
timeout 150 $C kernels-check --quick --golden models/golden --stages quant > $OUT/run53-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run53-checks.txt)"
grep -iE "fail|panic|over tol|graphs vs eager" $OUT/run53-checks.txt | cut -c1-150 | head
timeout 200 $C kernels-check --stages quant > $OUT/run53-quant.txt 2>&1
echo "quant rc=$? $(( $(date +%s) - S )) s"
grep -E "linear awq" $OUT/run53-quant.txt | cut -c1-150
wait $GP
for v in default off; do
  CLEAVE_AWQ_GEMV=$([ $v = off ] && echo off) timeout 100 $C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 1,8,64 --prefill 0 > $OUT/run53-v3l4-$v.txt 2>&1
  echo "v3l4 $v rc=$? $(( $(date +%s) - S )) s"; grep -E "CUDA graph|profile decode batch 1" $OUT/run53-v3l4-$v.txt | cut -c1-200
done
rm -rf /dev/shm/v3l4
