#!/bin/bash
# run 90 (one GPU): the bf16 persistent grouped GEMMs (gg_persistent) trigger their dependents
# after their work instead of after their wait. Checks under CLEAVE_PDL=all (the quick pass with
# golden fixtures and tiny-r1, graphs vs eager), then bf16 V2-Lite decode steps with
# CLEAVE_PDL=light (those GEMMs launched plainly) and all, one binary, same run.
# `bash kernels/bench/run90-ggp-pdl.sh [RUN]`.
for z in .carry/*.gz; do [ -f "${z%.gz}" ] || gunzip -k "$z"; done
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-90}
( gen_model v2lite --shape v2-lite ) &
GP=$!
CLEAVE_PDL=all timeout 150 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run${R}-checks-all.txt 2>&1
echo "checks (CLEAVE_PDL=all) rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run${R}-checks-all.txt)"
grep -iE "fail|panic|over tol" $OUT/run${R}-checks-all.txt | cut -c1-160 | head -10
bench_steps v2lite-light $C v2lite 1,4,16,64,256 CLEAVE_PDL=light
bench_steps v2lite-all $C v2lite 1,4,16,64,256 CLEAVE_PDL=all
bench_steps v2lite-light2 $C v2lite 1,64,256 CLEAVE_PDL=light
bench_steps v2lite-all2 $C v2lite 1,64,256 CLEAVE_PDL=all
wait $GP
rm -rf /dev/shm/v2lite*
