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
quick_checks $R
timeout 150 $C kernels-check --stages qdecode > $OUT/run${R}-qdecode.txt 2>&1
echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-qdecode.txt)"
grep -E "over tol" $OUT/run${R}-qdecode.txt | cut -c1-150 | head
BENCH_TIMEOUT=60 bench_steps v3l4-prev $P v3l4 1,8,64
BENCH_TIMEOUT=60 bench_steps v3l4-new $C v3l4 1,8,64
rm -rf /dev/shm/v3l4*
BENCH_TIMEOUT=420 bench_steps v3-61 $C v3awq 1,64
grep -vE "step ms by|allocations|compiled|module" $OUT/run${R}-v3-61.txt | tail -14 | cut -c1-300
wait $GP
rm -rf /dev/shm/v3awq*
