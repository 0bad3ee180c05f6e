#!/bin/bash
# run 66 (one GPU): AWQ 16-row tiles as two 8-token tiles with the weights as the MMAs' rows, the
# second skipped for items of at most 8 rows. Checks (quick pass: quant, qdecode, golden fixtures,
# tiny-r1-awq), the qgemm_tune sweep and whole steps, this binary against .carry/cleave-old (the
# 16-row kernels with tokens as the MMAs' rows) in the same run.
source kernels/bench/lib.sh
O=.carry/cleave-old; chmod +x $O
( $C gen-checkpoint --shape v3-layers --routed-experts 64 --dtype awq --out /dev/shm/v3e64 > /dev/null 2>&1
  $C gen-checkpoint --shape v2-lite --dtype awq --out /dev/shm/lite > /dev/null 2>&1 ) &
GP=$!
timeout 200 $C kernels-check --quick --stages quant,qdecode --golden models/golden --compare-model models/tiny-r1-awq > $OUT/run66-quick.txt 2>&1
echo "quick rc=$?: $(tail -1 $OUT/run66-quick.txt)"
grep -iE "over tol|fail|panic|error" $OUT/run66-quick.txt | grep -v "see note" | head -5
for b in new old; do
  B=$C; [ $b = old ] && B=$O
  timeout 180 $B kernels-check --stages qgemm_tune > /tmp/tune-$b.txt 2>&1; echo "tune $b rc=$?"
  grep -iE "over tol|failed|panic" /tmp/tune-$b.txt | head -3
  grep -E "^(qg tiled|qgp) " /tmp/tune-$b.txt | cut -c1-150 > $OUT/run66-tune-rows-$b.txt
done
python3 - <<'PY'
import os, re
out = os.environ["OUT"]
def rows(b):
    d = {}
    for l in open(f"{out}/run66-tune-rows-{b}.txt"):
        m = re.match(r"qgp (awq g\d+) (\S+)\s+(.*?) \(\d+ splits\)\s+(\S+)\s+\S+\s+([0-9.]+)\s", l)
        if m: d[(m.group(1), m.group(2), m.group(3))] = (float(m.group(5)), m.group(4))
    return d
n, o = rows("new"), rows("old")
for k in n:
    if k[1] == "256/64/4" and k in o and ("tok" in k[2] or "16 rows" in k[2]):
        print(f"{k[0]} {k[1]:<9} {k[2][:62]:<62} old {o[k][0]:>8.1f} new {n[k][0]:>8.1f} err {n[k][1]}")
PY
wait $GP
for m in v3e64:16,64,128:2048 lite:64,256:1024; do
  IFS=: read name batches ctx <<< "$m"
  for b in new old; do
    B=$C; [ $b = old ] && B=$O
    timeout 100 $B kernels-check --no-ops --bench-model /dev/shm/$name --batches $batches --ctx $ctx --prefill 0 > $OUT/run66-$name-$b.txt 2>&1
    echo "$name $b rc=$?: $(grep 'CUDA graph:' $OUT/run66-$name-$b.txt | sed -E 's/.*step ([0-9.]+ ms) \(([0-9.]+% of HBM).*/\1 \2/' | tr '\n' ';')"
  done
done
