#!/bin/bash
# run 86 (one GPU): MLA's absorbed products at a few rows on their own kernels (mla_uk, mla_uv,
# with programmatic dependent launch) instead of cuBLAS's batched GEMMs, and mla_combine reading
# only the splits that hold keys. Checks (the quick pass with golden fixtures, tiny-r1 and
# tiny-r1-awq; the attention stage, its few-row cases under every variant), then steps with the
# binary before ($CO, HEAD 0e6e664) and after in the same run, and the new one with
# CLEAVE_MLA_ABSORB=off and 4. `bash run86-absorb.sh 87` names run 87's files.
source kernels/bench/lib.sh
CO=.carry/cleave-old; chmod +x $CO
S=$(date +%s); R=${1:-86}
( $C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1
  $C gen-checkpoint --shape v2-lite --dtype awq --out /dev/shm/v2awq > /dev/null 2>&1
  $C gen-checkpoint --shape v3-layers --dtype awq --routed-experts 64 --out /dev/shm/v3l4 > /dev/null 2>&1 ) &
GP=$!
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run${R}-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-checks.txt)"
grep -iE "fail|panic|graphs vs eager|over tol|few rows" $OUT/run${R}-checks.txt | cut -c1-170 | head -30
timeout 120 $C kernels-check --quick --compare-model models/tiny-r1-awq > $OUT/run${R}-checks-awq.txt 2>&1
echo "checks awq rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-checks-awq.txt)"
grep -iE "fail|panic|graphs vs eager|over tol" $OUT/run${R}-checks-awq.txt | cut -c1-170 | head -8
timeout 150 $C kernels-check --stages attention > $OUT/run${R}-stages.txt 2>&1
echo "stages rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-stages.txt)"
grep -E "few rows|decode.*1 seqs|over tol" $OUT/run${R}-stages.txt | cut -c1-170 | head -30
wait $GP
bench() { # TAG BINARY MODEL BATCHES [ENV...]
  local tag=$1 b=$2 m=$3 bt=$4 ctx=1024; shift 4
  [ $m = v3l4 ] && ctx=2048
  env "$@" timeout 100 $b kernels-check --no-ops --bench-model /dev/shm/$m --ctx $ctx --batches $bt --prefill 0 > $OUT/run${R}-$tag.txt 2>&1
  echo "$tag rc=$? $(( $(date +%s) - S )) s"
}
bench v2lite-old $CO v2lite 1,2,4,8,64
bench v2lite-new $C v2lite 1,2,4,8,64
bench v2lite-off $C v2lite 1,2,4,8 CLEAVE_MLA_ABSORB=off
bench v2lite-r4 $C v2lite 1,2,4,8 CLEAVE_MLA_ABSORB=4
bench v2awq-old $CO v2awq 1,8
bench v2awq-new $C v2awq 1,8
bench v3l4-old $CO v3l4 1,8
bench v3l4-new $C v3l4 1,8
grep -E "profile decode" $OUT/run${R}-v2lite-new.txt | head -2 | cut -c1-400
rm -rf /dev/shm/v2lite /dev/shm/v2awq /dev/shm/v3l4
echo "== summary"
for f in $OUT/run${R}-v2*.txt $OUT/run${R}-v3l4-*.txt; do echo "$(basename $f)"; grep "CUDA graph" $f | cut -c1-72; done
