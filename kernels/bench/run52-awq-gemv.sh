#!/bin/bash
# run 52 (one GPU): the AWQ GEMV for dense linears of 1-8 rows, the MLA prologue spread over
# blocks, and v3 decode writing its output at one split (no mla_combine). Checks (quick pass
# with golden fixtures and tiny-r1; the quant and attention stages at real shapes), then the
# same run's steps with the binary before these changes ($CO) and after: bf16 V2-Lite at batch
# 1/64/256, four V3 layers in AWQ (64 routed experts) at batch 1/8/64 with and without the AWQ
# GEMV, and the 61-layer V3 AWQ share at batch 1/64.
source kernels/bench/lib.sh
CO=.carry/cleave-before; chmod +x $CO
S=$(date +%s)
( $C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1
  $C gen-checkpoint --shape v3-layers --dtype awq --routed-experts 64 --out /dev/shm/v3l4 > /dev/null 2>&1 ) &
GP=$!
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run52-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run52-checks.txt)"
grep -iE "fail|panic|graphs vs eager|over tol|one split|gemv|prologue" $OUT/run52-checks.txt | cut -c1-160 | head -30
timeout 150 $C kernels-check --stages quant,attention > $OUT/run52-stages.txt 2>&1
echo "stages rc=$? $(( $(date +%s) - S )) s"
grep -E "linear awq|decode" $OUT/run52-stages.txt | cut -c1-160
wait $GP
for bin in before after; do
  B=$C; [ $bin = before ] && B=$CO
  timeout 120 $B kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,64,256 --prefill 0 > $OUT/run52-v2lite-$bin.txt 2>&1
  echo "v2lite $bin rc=$? $(( $(date +%s) - S )) s"; grep -E "CUDA graph|profile decode" $OUT/run52-v2lite-$bin.txt | cut -c1-200
  timeout 120 $B kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 1,8,64 --prefill 0 > $OUT/run52-v3l4-$bin.txt 2>&1
  echo "v3l4 $bin rc=$? $(( $(date +%s) - S )) s"; grep -E "CUDA graph|profile decode" $OUT/run52-v3l4-$bin.txt | cut -c1-200
done
CLEAVE_AWQ_GEMV=off timeout 120 $C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 1,8,64 --prefill 0 > $OUT/run52-v3l4-nogemv.txt 2>&1
echo "v3l4 no-gemv rc=$? $(( $(date +%s) - S )) s"; grep -E "CUDA graph" $OUT/run52-v3l4-nogemv.txt | cut -c1-200
rm -rf /dev/shm/v2lite /dev/shm/v3l4
echo "== summary"
for f in $OUT/run52-v2lite-*.txt $OUT/run52-v3l4-*.txt; do echo "$(basename $f): $(grep -oE 'CUDA graph: step [0-9.]+ ms \([0-9.]+% of HBM' $f | tr '\n' ' ')"; done
