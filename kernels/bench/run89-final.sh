#!/bin/bash
# run 89 (one GPU): the session's final binary (stacked input projections, compressed decode
# GEMMs under programmatic dependent launch, expert ones included). Two binaries travel gzipped:
# cleave-prev (run 88's, dense compressed GEMMs only under PDL) and cleave (this commit).
#   checks: the quick pass (golden fixtures, tiny-r1, tiny-r1-awq) with graphs vs eager, and the
#           qdecode stage.
#   steps:  four V3 layers in AWQ, both binaries in the same run; then the real model's decode,
#           one GPU's share (run 19's shape: 61 V3 layers in AWQ g64 with 64 routed experts per
#           layer, context 2,048), batches 1 and 64, generated in host memory.
# `bash kernels/bench/run89-final.sh [RUN]`.
for z in .carry/*.gz; do [ -f "${z%.gz}" ] || gunzip -k "$z"; done
source kernels/bench/lib.sh
P=.carry/cleave-prev; chmod +x $P
S=$(date +%s); R=${1:-89}
free -g | head -2; df -BG /dev/shm | tail -1
( $C gen-checkpoint --shape v3-layers --dtype awq --routed-experts 64 --out /dev/shm/v3l4 > /dev/null 2>&1; touch /dev/shm/v3l4.done
  AVAIL=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9); L=$(( (AVAIL - 6) * 100 / 167 )); [ $L -gt 61 ] && L=61
  $C gen-checkpoint --shape v3-layers --layers $L --routed-experts 64 --dtype awq --out /dev/shm/v3awq > /tmp/gen.txt 2>&1
  echo "gen $L layers rc=$? $(( $(date +%s) - S )) s: $(tail -1 /tmp/gen.txt)"; touch /dev/shm/v3awq.done ) &
GP=$!
timeout 150 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run${R}-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-checks.txt)"
grep -iE "fail|panic|over tol" $OUT/run${R}-checks.txt | cut -c1-160 | head -10
timeout 100 $C kernels-check --quick --compare-model models/tiny-r1-awq > $OUT/run${R}-checks-awq.txt 2>&1
echo "checks awq rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-checks-awq.txt)"
grep -iE "fail|panic|graphs vs eager|over tol" $OUT/run${R}-checks-awq.txt | cut -c1-160 | head -6
timeout 150 $C kernels-check --stages qdecode > $OUT/run${R}-qdecode.txt 2>&1
echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-qdecode.txt)"
grep -E "over tol" $OUT/run${R}-qdecode.txt | cut -c1-150 | head
bench() { # TAG BINARY MODEL BATCHES TIMEOUT: waits for the model's generator
  while [ ! -f /dev/shm/$3.done ]; do sleep 1; done
  timeout $5 $2 kernels-check --no-ops --bench-model /dev/shm/$3 --ctx 2048 --batches $4 --prefill 0 > $OUT/run${R}-$1.txt 2>&1
  echo "$1 rc=$? $(( $(date +%s) - S )) s: $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run${R}-$1.txt | grep -o '[0-9.]* ms' | tr '\n' ' ')"
}
bench v3l4-prev $P v3l4 1,8,64 60
bench v3l4-new $C v3l4 1,8,64 60
rm -rf /dev/shm/v3l4*
bench v3-61 $C v3awq 1,64 420
grep -vE "step ms by|allocations|compiled|module" $OUT/run${R}-v3-61.txt | tail -14 | cut -c1-300
wait $GP
rm -rf /dev/shm/v3awq*
