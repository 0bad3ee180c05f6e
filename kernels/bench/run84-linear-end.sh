#!/bin/bash
# run 84 (one GPU): the attention output's projection joined to the residual by the GEMV's last
# block (`CLEAVE_LINEAR_END`), on top of runs 79-83's fusions. Checks (quick passes with golden
# fixtures, tiny-r1 and tiny-r1-awq; the linear, router and experts stages), then bf16 V2-Lite
# steps with the binary before these runs ($CO, 8fa23a4), the new one, and the new one with
# the join separate, in the same run.
source kernels/bench/lib.sh
CO=.carry/cleave-old; chmod +x $CO
S=$(date +%s); R=${1:-84}
( $C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1 ) &
GP=$!
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run$R-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-checks.txt)"
timeout 120 $C kernels-check --quick --compare-model models/tiny-r1-awq > $OUT/run$R-checks-awq.txt 2>&1
echo "checks awq rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-checks-awq.txt)"
grep -hiE "fail|panic|graphs vs eager|over tol" $OUT/run$R-checks*.txt | cut -c1-110 | head -16
timeout 150 $C kernels-check --stages linear,router,experts > $OUT/run$R-stages.txt 2>&1
echo "stages rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-stages.txt)"
grep -E "^linear \+ add|over tol" $OUT/run$R-stages.txt | cut -c1-130 | head -12
wait $GP
bench() {  # NAME BIN
  timeout 100 $2 kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,2,4,16,64 --prefill 0 > $OUT/run$R-$1.txt 2>&1
  echo "$1 rc=$? $(( $(date +%s) - S )) s: $(grep 'CUDA graph' $OUT/run$R-$1.txt | grep -oE 'step [0-9.]+ ms' | tr '\n' ' ')"
}
bench old $CO
bench new $C
CLEAVE_LINEAR_END=separate bench sep $C
bench new2 $C
CLEAVE_LINEAR_END=separate bench sep2 $C
grep -E "profile decode batch 1:" $OUT/run$R-new.txt | cut -c1-400
rm -rf /dev/shm/v2lite
