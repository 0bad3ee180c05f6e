#!/bin/bash
# run 62 (one GPU): qg_persistent's loader with one pointer add per copy (no per-copy address
# arithmetic) and predicated cp.async. Checks (quant, qdecode, golden AWQ/FP8 fixtures,
# tiny-r1-awq), then the qgemm_tune sweep with the new binary and the previous one
# (.carry/cleave-old, the HEAD before the change) in the same run.
source kernels/bench/lib.sh
O=.carry/cleave-old; chmod +x $O
S=$(date +%s)
timeout 200 $C kernels-check --quick --stages quant,qdecode --golden models/golden --compare-model models/tiny-r1-awq > $OUT/run62-quick.txt 2>&1
echo "quick rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run62-quick.txt)"
grep -iE "over tol|fail|panic|error" $OUT/run62-quick.txt | head -5
for b in new old; do
  B=$C; [ $b = old ] && B=$O
  S=$(date +%s)
  timeout 180 $B kernels-check --stages qgemm_tune > /tmp/tune-$b.txt 2>&1; echo "tune $b rc=$? $(( $(date +%s) - S )) s"
  grep -iE "over tol|failed|panic" /tmp/tune-$b.txt | head -3
  sed -n '/^qgemm_tune:/,$p' /tmp/tune-$b.txt | grep "  " | cut -c1-220 > $OUT/run62-tune-$b.txt
  grep -E "^(qg tiled|qgp) " /tmp/tune-$b.txt | cut -c1-150 > $OUT/run62-tune-rows-$b.txt
done
python3 - <<'PY'
import re, os
out = os.environ.get("OUT", ".")
def rows(b):
    d = {}
    for l in open(f"{out}/run62-tune-{b}.txt"):
        m = re.match(r"\s+(.*?): tiled .*persistent (\S+) ([0-9.]+) us \(([0-9.]+)% HBM\)", l)
        if m: d[m.group(1)] = (m.group(2), float(m.group(3)), float(m.group(4)))
    return d
n, o = rows("new"), rows("old")
print(f"{'case':<78} {'old':>18} {'new':>18}")
for k in n:
    if k in o and ("tok" in k or " 1 rows" in k):
        print(f"{k[:78]:<78} {o[k][1]:>8.1f} {o[k][2]:>5.1f}% {n[k][1]:>8.1f} {n[k][2]:>5.1f}%")
PY
