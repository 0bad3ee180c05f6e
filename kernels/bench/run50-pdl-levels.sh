#!/bin/bash
# run 50 (one GPU): programmatic dependent launch by level: light (default: the persistent
# grouped GEMMs left out), all, off. The quick pass with golden fixtures and tiny-r1 (graphs vs
# eager), then the bf16 V2-Lite decode at batch 1/2/4/8/64/256 under each level, same run.
source kernels/bench/lib.sh
S=$(date +%s)
$C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1 &
GP=$!
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run50-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run50-checks.txt)"
grep -iE "fail|panic|graphs vs eager|over tol" $OUT/run50-checks.txt | cut -c1-150 | head -24
wait $GP
for mode in light all off; do
  case $mode in
    all) export CLEAVE_PDL=all ;;
    off) export CLEAVE_PDL=off ;;
  esac
  timeout 170 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,2,4,8,64,256 --prefill 0 > $OUT/run50-v2lite-$mode.txt 2>&1
  echo "bench $mode rc=$? $(( $(date +%s) - S )) s"
  grep -E "CUDA graph|profile decode batch 1|rror" $OUT/run50-v2lite-$mode.txt | cut -c1-250
done
rm -rf /dev/shm/v2lite
