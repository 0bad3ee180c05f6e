#!/bin/bash
# run 88 (one GPU): dense compressed decode GEMMs (qg_persistent without expert tiles) launched
# with programmatic dependent launch, their first weights prefetched into L2 (one bulk prefetch
# per 8-column group) before they wait for the kernel before them; qgemm_reduce and the FP8
# activation quantization waiting likewise. Two binaries travel gzipped: cleave-prev (1fc5f10,
# run 87's stacked projections) and cleave (this commit).
#   checks: the quick pass (golden fixtures and tiny-r1, then tiny-r1-awq) with graphs vs eager,
#           and the qdecode stage (every compressed linear, linear_split and the experts).
#   steps:  whole decode steps from CUDA graphs, both binaries in the same run, AWQ and FP8
#           V2-Lite and four V3 layers in AWQ; the new binary also with CLEAVE_PDL=all (expert
#           GEMMs too) and off.
# `bash kernels/bench/run88-qgemm-pdl.sh [RUN]`.
for z in .carry/*.gz; do [ -f "${z%.gz}" ] || gunzip -k "$z"; done
source kernels/bench/lib.sh
P=.carry/cleave-prev; chmod +x $P
S=$(date +%s); R=${1:-88}
gen() { $C gen-checkpoint "${@:2}" --out /dev/shm/$1 > /dev/null 2>&1; touch /dev/shm/$1.done; }
( gen v2awq --shape v2-lite --dtype awq; gen v3l4 --shape v3-layers --dtype awq --routed-experts 64
  gen v2fp8 --shape v2-lite --dtype fp8 ) &
GP=$!
timeout 150 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run${R}-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-checks.txt)"
grep -iE "fail|panic|over tol" $OUT/run${R}-checks.txt | cut -c1-160 | head -10
timeout 100 $C kernels-check --quick --compare-model models/tiny-r1-awq > $OUT/run${R}-checks-awq.txt 2>&1
echo "checks awq rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-checks-awq.txt)"
grep -iE "fail|panic|graphs vs eager|over tol" $OUT/run${R}-checks-awq.txt | cut -c1-160 | head -6
timeout 150 $C kernels-check --stages qdecode > $OUT/run${R}-qdecode.txt 2>&1
echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-qdecode.txt)"
grep -E "over tol|linear awq g64 persistent|linear fp8 b128 persistent|linear_split (awq g64|fp8)" $OUT/run${R}-qdecode.txt | cut -c1-150 | head -24
D=$OUT; OUT=/tmp/run${R}; mkdir -p $OUT
bench() { # TAG BINARY MODEL BATCHES [ENV...]: waits for the model's generator
  local tag=$1 b=$2 m=$3 bt=$4 ctx=1024; shift 4
  [ $m = v3l4 ] && ctx=2048
  while [ ! -f /dev/shm/$m.done ]; do sleep 1; done
  env "$@" timeout 100 $b kernels-check --no-ops --bench-model /dev/shm/$m --ctx $ctx --batches $bt --prefill 0 > $OUT/run${R}-$tag.txt 2>&1
  echo "$tag rc=$? $(( $(date +%s) - S )) s: $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run${R}-$tag.txt | grep -o '[0-9.]* ms' | tr '\n' ' ')"
}
bench v2awq-prev $P v2awq 1,8,64
bench v2awq-new $C v2awq 1,8,64
bench v2awq-all $C v2awq 1,8,64 CLEAVE_PDL=all
grep -E "profile decode batch 1" $OUT/run${R}-v2awq-new.txt | cut -c1-400
bench v3l4-prev $P v3l4 1,8,64
bench v3l4-new $C v3l4 1,8,64
bench v3l4-all $C v3l4 1,8,64 CLEAVE_PDL=all
bench v2fp8-prev $P v2fp8 1,8,64
bench v2fp8-new $C v2fp8 1,8,64
bench v2fp8-off $C v2fp8 1,8 CLEAVE_PDL=off
wait $GP
rm -rf /dev/shm/v2awq* /dev/shm/v3l4* /dev/shm/v2fp8*
tar czf $D/run${R}-steps.tgz -C $OUT .
