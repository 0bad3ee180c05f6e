#!/bin/bash
# run 27 (one GPU): the persistent compressed decode GEMM with 64-row tiles for dense GEMMs of
# more than 16 rows (each weight unpacked once for four MMAs). Checks (quick with the golden
# fixtures and tiny-r1-awq, then the qdecode stage), the qgemm_tune sweep, and decode steps on
# V2-Lite and 4 layers of V3 in AWQ and FP8. At most 8 files come back. Stripped binary in .carry/.
source kernels/bench/lib.sh
( for d in awq fp8; do $C gen-checkpoint --shape v2-lite --dtype $d --out /dev/shm/v2lite-$d > /dev/null 2>&1; done
  for d in awq fp8; do $C gen-checkpoint --shape v3-layers --dtype $d --out /dev/shm/v3l4-$d > /dev/null 2>&1; done ) &
GP=$!
timeout 170 $C kernels-check --quick --stages quant,qdecode --golden models/golden --compare-model models/tiny-r1-awq > $OUT/run27-quick.txt 2>&1
echo "quick rc=$?"; grep -E "over tol|FAIL|failed|rror|panic|within tolerance" $OUT/run27-quick.txt | head -5
grep -E "^(awq|fp8|tiny-r1-awq).* f32 " $OUT/run27-quick.txt | head -6
timeout 170 $C kernels-check --stages qdecode > $OUT/run27-qdecode.txt 2>&1; echo "qdecode rc=$?"
grep -E "over tol|failed|rror|panic|within tolerance" $OUT/run27-qdecode.txt | head -5
grep -E "^linear .* (64|128) x" $OUT/run27-qdecode.txt | cut -c1-150
timeout 150 $C kernels-check --stages qgemm_tune > $OUT/run27-tune.txt 2>&1; echo "tune rc=$?"
grep -E "over tol|failed|rror|panic" $OUT/run27-tune.txt | head -5
grep -E "^  .*64 rows" $OUT/run27-tune.txt | cut -c1-190
wait $GP
for m in v2lite-awq v2lite-fp8 v3l4-awq v3l4-fp8; do
  case $m in v2lite*) B=1,16,64,256; X=1024;; *) B=1,64,256; X=2048;; esac
  timeout 100 $C kernels-check --no-ops --bench-model /dev/shm/$m --batches $B --ctx $X --prefill 0 > /tmp/b.txt 2>&1
  echo "bench $m rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ |profile decode batch 64" /tmp/b.txt | cut -c1-230
  cat /tmp/b.txt >> $OUT/run27-bench.txt
done
