#!/bin/bash
# run 68 (one GPU): split-K counts for dense compressed decode GEMMs chosen by estimated time
# (weights over the blocks' balance plus the partial sums' traffic) instead of the fewest splits
# that give every block an item. The quick checks, the qgemm_tune dense rows and whole steps,
# this binary against .carry/cleave-old (the previous rule) in the same run.
source kernels/bench/lib.sh
O=.carry/cleave-old; chmod +x $O
( $C gen-checkpoint --shape v3-layers --dtype awq --out /dev/shm/v3 > /dev/null 2>&1
  $C gen-checkpoint --shape v3-layers --dtype fp8 --out /dev/shm/v3f > /dev/null 2>&1
  $C gen-checkpoint --shape v2-lite --dtype awq --out /dev/shm/lite > /dev/null 2>&1 ) &
GP=$!
timeout 200 $C kernels-check --quick --stages quant,qdecode --golden models/golden --compare-model models/tiny-r1-awq > $OUT/run68-quick.txt 2>&1
echo "quick rc=$?: $(tail -1 $OUT/run68-quick.txt)"
for b in new old; do
  B=$C; [ $b = old ] && B=$O
  timeout 180 $B kernels-check --stages qgemm_tune > /tmp/tune-$b.txt 2>&1; echo "tune $b rc=$?"
  grep -E "^  .* rows, " /tmp/tune-$b.txt | cut -c1-200 > $OUT/run68-tune-$b.txt
done
paste -d'|' $OUT/run68-tune-old.txt $OUT/run68-tune-new.txt | sed -E 's/: tiled [^|]*persistent/ old/; s/\|.*persistent/ | new/' | cut -c1-170
wait $GP
for m in v3:1,16,64:2048 v3f:1,16,64:2048 lite:1,16:1024; do
  IFS=: read name batches ctx <<< "$m"
  for b in new old; do
    B=$C; [ $b = old ] && B=$O
    timeout 100 $B kernels-check --no-ops --bench-model /dev/shm/$name --batches $batches --ctx $ctx --prefill 0 > $OUT/run68-$name-$b.txt 2>&1
    echo "$name $b rc=$?: $(grep 'CUDA graph:' $OUT/run68-$name-$b.txt | sed -E 's/.*step ([0-9.]+ ms) \(([0-9.]+% of HBM).*/\1 \2/' | tr '\n' ';')"
  done
done
