#!/bin/bash
# run 49 (one GPU): programmatic dependent launch for the decode step's own kernels (the GEMV
# reads its first weights before waiting), GEMV default 4 rows. The quick pass with golden
# fixtures and tiny-r1 (graphs vs eager), then the bf16 V2-Lite decode at batch 1/2/4/8/64/256:
# defaults, CLEAVE_PDL=off, and the kernels before run 48 (GEMV off, separate prologue, no PDL).
source kernels/bench/lib.sh
S=$(date +%s)
$C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1 &
GP=$!
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run49-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run49-checks.txt)"
grep -iE "fail|panic|graphs vs eager|over tol|gemv|prologue" $OUT/run49-checks.txt | cut -c1-150 | head -24
wait $GP
for mode in new nopdl old; do
  case $mode in
    nopdl) export CLEAVE_PDL=off ;;
    old) export CLEAVE_PDL=off CLEAVE_DENSE_GEMV=off CLEAVE_MLA_PROLOGUE=separate ;;
  esac
  timeout 170 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,2,4,8,64,256 --prefill 0 > $OUT/run49-v2lite-$mode.txt 2>&1
  echo "bench $mode rc=$? $(( $(date +%s) - S )) s"
  grep -E "CUDA graph|profile decode batch 1|rror" $OUT/run49-v2lite-$mode.txt | cut -c1-250
done
rm -rf /dev/shm/v2lite
