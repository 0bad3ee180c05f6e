#!/bin/bash
# run 81 (one GPU): the decode fusions of runs 79-80 with their thresholds as settings
# (CLEAVE_ROUTE_ALIGN, CLEAVE_MLA_COMBINE_UV, CLEAVE_MOE_END) and mla_combine_uv's rows in one
# loop. Checks (quick pass with golden fixtures and tiny-r1; attention and experts stages with
# each fusion at its limit), then bf16 V2-Lite steps per setting and both binaries in the same
# run, and four V3 layers in AWQ (64 routed experts) old and new.
source kernels/bench/lib.sh
CO=.carry/cleave-old; chmod +x $CO
S=$(date +%s); R=${1:-81}
( $C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1
  $C gen-checkpoint --shape v3-layers --dtype awq --routed-experts 64 --out /dev/shm/v3l4 > /dev/null 2>&1 ) &
GP=$!
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run$R-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run$R-checks.txt)"
grep -iE "fail|panic|graphs vs eager|over tol" $OUT/run$R-checks.txt | cut -c1-170 | head -12
timeout 150 $C kernels-check --stages attention,experts > $OUT/run$R-stages.txt 2>&1
echo "stages rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run$R-stages.txt)"
grep -E "^mla_attention v3 +few rows|moe layer.* v2 |over tol" $OUT/run$R-stages.txt | cut -c1-150 | head -12
wait $GP
bench() {  # NAME BIN BATCHES MODEL [CTX]
  timeout 100 $2 kernels-check --no-ops --bench-model $4 --batches $3 --prefill 0 ${5:+--ctx $5} > $OUT/run$R-$1.txt 2>&1
  echo "$1 rc=$? $(( $(date +%s) - S )) s: $(grep 'CUDA graph' $OUT/run$R-$1.txt | grep -oE 'step [0-9.]+ ms' | tr '\n' ' ')"
}
bench v2lite-old $CO 1,2,4,16,64 /dev/shm/v2lite
bench v2lite-new $C 1,2,4,16,64 /dev/shm/v2lite
for u in off 2 4; do CLEAVE_MLA_COMBINE_UV=$u bench v2lite-uv$u $C 1,2,4 /dev/shm/v2lite; done
for a in off 16 64; do CLEAVE_ROUTE_ALIGN=$a bench v2lite-ra$a $C 1,16,64 /dev/shm/v2lite; done
CLEAVE_MOE_END=separate bench v2lite-endsep $C 1,16,64 /dev/shm/v2lite
bench v2lite-new2 $C 1,2,4,16,64 /dev/shm/v2lite
bench v3l4-old $CO 1,8,64 /dev/shm/v3l4 2048
bench v3l4-new $C 1,8,64 /dev/shm/v3l4 2048
grep -E "profile decode batch 1:" $OUT/run$R-v2lite-new.txt | cut -c1-400
rm -rf /dev/shm/v2lite /dev/shm/v3l4
