#!/bin/bash
# run 149 (one GPU), a diagnostic: where the seesaw v4's warps wait, per SASS instruction (ncu's
# warp-state sampling, source page), one launch in four V3 layers in AWQ at batch 64 (context
# 2,048). Prints the 45 instructions with the most samples, with their neighbourhood's totals.
# `timeout 300 bash kernels/bench/run149-mla-sass.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-149}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64
timeout 150 ncu --clock-control none --kernel-name regex:mla_decode4 --launch-count 1 --section SourceCounters \
  --section WarpStateStats -f -o /tmp/prof $C kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 64 --prefill 0 \
  > $OUT/run$R-ncu-log.txt 2>&1
echo "ncu rc=$? $(( $(date +%s) - S )) s"
tail -n 3 $OUT/run$R-ncu-log.txt
ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass > $OUT/run$R-sass.csv 2>&1
echo "source page rc=$? lines $(wc -l < $OUT/run$R-sass.csv)"
head -c 600 $OUT/run$R-sass.csv; echo
python3 - $OUT/run$R-sass.csv <<'PY'
import csv, sys, re
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"') and 'Source' in l)
rows = list(csv.DictReader(lines[start:]))
cols = list(rows[0].keys()); print("columns:", cols[:40])
samp = next(c for c in cols if c.startswith("Warp Stall Sampling (All"))
def f(x):
    try: return float(x.replace(",", ""))
    except: return 0.0
tot = sum(f(r[samp]) for r in rows); print("total samples", tot, "instructions", len(rows))
stall_cols = [c for c in cols if c.startswith("stall_") or "Stall" in c and c != samp]
idx = sorted(range(len(rows)), key=lambda i: -f(rows[i][samp]))[:45]
for i in sorted(idx):
    r = rows[i]
    top = sorted(((f(r[c]), c) for c in cols if c not in (samp,) and re.search("stall|Stall", c)), reverse=True)[:2]
    print(f"{i:5} {f(r[samp]) / tot * 100:5.1f}% {r['Source'][:70]:70} {' '.join(f'{c[:28]}={v:.0f}' for v, c in top)}")
PY
