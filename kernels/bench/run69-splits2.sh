#!/bin/bash
# run 69 (one GPU): run 68's split rule with at least four k-tiles per split and, where possible,
# an item for every block: the quick checks, the qgemm_tune dense rows (this binary only; run 68
# has the previous rule's) and whole steps against .carry/cleave-old in the same run.
source kernels/bench/lib.sh
O=.carry/cleave-old; chmod +x $O
( $C gen-checkpoint --shape v3-layers --dtype awq --out /dev/shm/v3 > /dev/null 2>&1
  $C gen-checkpoint --shape v3-layers --dtype fp8 --out /dev/shm/v3f > /dev/null 2>&1 ) &
GP=$!
timeout 200 $C kernels-check --quick --stages quant,qdecode --golden models/golden --compare-model models/tiny-r1-awq > $OUT/run69-quick.txt 2>&1
echo "quick rc=$?: $(tail -1 $OUT/run69-quick.txt)"
timeout 180 $C kernels-check --stages qgemm_tune > /tmp/tune.txt 2>&1; echo "tune rc=$?"
grep -E "^  .* rows, " /tmp/tune.txt | cut -c1-200 > $OUT/run69-tune.txt
grep -E "V3 (o_proj|mlp|q_b) 1 rows" $OUT/run69-tune.txt | cut -c1-150
wait $GP
for name in v3 v3f; do
  for b in new old; do
    B=$C; [ $b = old ] && B=$O
    timeout 100 $B kernels-check --no-ops --bench-model /dev/shm/$name --batches 1,16,64 --ctx 2048 --prefill 0 > /tmp/b.txt 2>&1
    echo "$name $b rc=$?: $(grep 'CUDA graph:' /tmp/b.txt | sed -E 's/.*step ([0-9.]+ ms) \(([0-9.]+% of HBM).*/\1 \2/' | tr '\n' ';')"
    grep -E "^ +[0-9]+ +[0-9.]+ |CUDA graph:" /tmp/b.txt > $OUT/run69-$name-$b.txt
  done
done
