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
( gen_model v2awq --shape v2-lite --dtype awq; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64
  gen_model v2fp8 --shape v2-lite --dtype fp8 ) &
GP=$!
quick_checks $R
timeout 150 $C kernels-check --stages qdecode > $OUT/run${R}-qdecode.txt 2>&1
echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-qdecode.txt)"
grep -E "over tol|linear awq g64 persistent|linear fp8 b128 persistent|linear_split (awq g64|fp8)" $OUT/run${R}-qdecode.txt | cut -c1-150 | head -24
D=$OUT; OUT=/tmp/run${R}; mkdir -p $OUT
bench_steps v2awq-prev $P v2awq 1,8,64
bench_steps v2awq-new $C v2awq 1,8,64
bench_steps v2awq-all $C v2awq 1,8,64 CLEAVE_PDL=all
grep -E "profile decode batch 1" $OUT/run${R}-v2awq-new.txt | cut -c1-400
bench_steps v3l4-prev $P v3l4 1,8,64
bench_steps v3l4-new $C v3l4 1,8,64
bench_steps v3l4-all $C v3l4 1,8,64 CLEAVE_PDL=all
bench_steps v2fp8-prev $P v2fp8 1,8,64
bench_steps v2fp8-new $C v2fp8 1,8,64
bench_steps v2fp8-off $C v2fp8 1,8 CLEAVE_PDL=off
wait $GP
rm -rf /dev/shm/v2awq* /dev/shm/v3l4* /dev/shm/v2fp8*
tar czf $D/run${R}-steps.tgz -C $OUT .
