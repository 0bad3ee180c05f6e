#!/bin/bash
# run 30 (one GPU): split-K of the persistent compressed GEMM summed by the last split to finish
# (no qgemm_reduce launch). Checks (quick with the golden fixtures and tiny-r1-awq; the qdecode
# stage, whose dense linears split), the sweep's dense cases, and decode steps on V2-Lite and 4 V3
# layers in AWQ and FP8. Stripped binary in .carry/.
source kernels/bench/lib.sh
( for d in awq fp8; do $C gen-checkpoint --shape v2-lite --dtype $d --out /dev/shm/v2lite-$d > /dev/null 2>&1; done
  for d in awq fp8; do $C gen-checkpoint --shape v3-layers --dtype $d --out /dev/shm/v3l4-$d > /dev/null 2>&1; done ) &
GP=$!
timeout 170 $C kernels-check --quick --stages quant,qdecode --golden models/golden --compare-model models/tiny-r1-awq > $OUT/run30-quick.txt 2>&1
echo "quick rc=$?"; grep -E "over tol|FAIL|failed|rror|panic|within tolerance" $OUT/run30-quick.txt | head -5
grep -E "^(awq|fp8|tiny-r1-awq).* (f32|bf16) " $OUT/run30-quick.txt | head -8
timeout 170 $C kernels-check --stages qdecode > $OUT/run30-qdecode.txt 2>&1; echo "qdecode rc=$?"
grep -E "over tol|failed|rror|panic|within tolerance" $OUT/run30-qdecode.txt | head -5
grep -E "^linear .*persistent" $OUT/run30-qdecode.txt | cut -c1-150
timeout 150 $C kernels-check --stages qgemm_tune > $OUT/run30-tune.txt 2>&1; echo "tune rc=$?"
grep -E "over tol|failed|rror|panic" $OUT/run30-tune.txt | head -5
grep -E "^  .* rows" $OUT/run30-tune.txt | cut -c1-190
wait $GP
for m in v2lite-awq v2lite-fp8 v3l4-awq v3l4-fp8; do
  case $m in v2lite*) B=1,16,64,256; X=1024;; *) B=1,64,256; X=2048;; esac
  timeout 100 $C kernels-check --no-ops --bench-model /dev/shm/$m --batches $B --ctx $X --prefill 0 > /tmp/b.txt 2>&1
  echo "bench $m rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ |profile decode batch 1:" /tmp/b.txt | cut -c1-200
  cat /tmp/b.txt >> $OUT/run30-bench.txt
done
