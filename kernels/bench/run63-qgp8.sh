#!/bin/bash
# run 63 (one GPU): AWQ decode GEMMs with 8-row tiles, the weights as the MMAs' 16-row operand
# (qgp8_*, the default for AWQ experts and dense GEMMs of up to 8 rows).
#   checks: the quant and qdecode stages (every AWQ/FP8 linear and expert against the CPU), the
#           golden fixtures and tiny-r1-awq through the engine (graphs vs eager), then the
#           qgemm_tune sweep (8- and 16-row shapes against the tiled kernel on the same rows).
#   steps:  whole decode steps, this binary against .carry/cleave-old (HEAD before runs 62-63) in
#           the same run: V2-Lite and four V3 layers, AWQ and FP8.
source kernels/bench/lib.sh
O=.carry/cleave-old; chmod +x $O
if [ "$1" = checks ]; then
  S=$(date +%s)
  timeout 200 $C kernels-check --quick --stages quant,qdecode --golden models/golden --compare-model models/tiny-r1-awq > $OUT/run63-quick.txt 2>&1
  echo "quick rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run63-quick.txt)"
  grep -iE "over tol|fail|panic|error" $OUT/run63-quick.txt | grep -v "see note" | head -5
  timeout 200 $C kernels-check --stages qdecode > $OUT/run63-qdecode.txt 2>&1
  echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run63-qdecode.txt)"
  grep -E "awq" $OUT/run63-qdecode.txt | grep -E "persistent|experts" | cut -c1-150 | head -20
  timeout 180 $C kernels-check --stages qgemm_tune > /tmp/tune.txt 2>&1; echo "tune rc=$? $(( $(date +%s) - S )) s"
  grep -iE "over tol|failed|panic" /tmp/tune.txt | head -3
  sed -n '/^qgemm_tune:/,$p' /tmp/tune.txt > $OUT/run63-tune.txt
  grep -E "^(qg tiled|qgp) " /tmp/tune.txt | cut -c1-150 > $OUT/run63-tune-rows.txt
  grep -E "awq g64 (8x)?256/64/4 .*(V3|V2-Lite) (16|64) tok|awq g64 (8x)?256/64/4 .*1 rows" $OUT/run63-tune-rows.txt | cut -c1-140
  grep -E "awq" $OUT/run63-tune.txt | grep -E "tok|1 rows" | cut -c1-200
fi
if [ "$1" = steps ]; then
  ( $C gen-checkpoint --shape v2-lite --dtype awq --out /dev/shm/lite-awq > /dev/null 2>&1
    $C gen-checkpoint --shape v3-layers --dtype awq --out /dev/shm/v3-awq > /dev/null 2>&1
    $C gen-checkpoint --shape v2-lite --dtype fp8 --out /dev/shm/lite-fp8 > /dev/null 2>&1 ) &
  GP=$!
  bench() {  # tag binary model batches ctx
    S=$(date +%s)
    timeout 120 $2 kernels-check --no-ops --bench-model $3 --batches $4 --ctx $5 --prefill 0 > $OUT/run63-$1.txt 2>&1
    echo "$1 rc=$? $(( $(date +%s) - S )) s"
    grep -E "^ +[0-9]+ +[0-9.]+ |CUDA graph:" $OUT/run63-$1.txt | cut -c1-120
  }
  wait $GP
  for b in new old; do B=$C; [ $b = old ] && B=$O; bench lite-awq-$b $B /dev/shm/lite-awq 1,16,64,256 1024; done
  for b in new old; do B=$C; [ $b = old ] && B=$O; bench v3-awq-$b $B /dev/shm/v3-awq 1,64,256 2048; done
  for b in new old; do B=$C; [ $b = old ] && B=$O; bench lite-fp8-$b $B /dev/shm/lite-fp8 16,64 1024; done
fi
