#!/bin/bash
# run 163 (one GPU): the AWQ decode GEMMs (mma.sync paths: 8-row and 16-row tiles) with the zero
# point out of the unpacking: weights enter the MMAs as 128 + q (one LOP3 a pair instead of a LOP3
# and a bf16 FMA), and one more MMA per column group takes -(128 + z) times each token's sum over
# the k-tile. qgemm_tune (every shape against the tiled kernel, 1e-3) with this build and the one
# before ($P), the quick pass, four V3 layers (64 experts) and V2-Lite in AWQ with both, then the
# 61-layer V3 share at batches 1 and 64.
# `timeout 570 bash kernels/bench/run163-zero-fold.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-163}
nvidia-smi --query-gpu=name --format=csv,noheader
awq_models_gen
$P kernels-check --quick --stages sample > /dev/null 2>&1 &
qgemm_tune_run tune-full
qgemm_tune_run tune-prev $P
quick_checks $R
wait
awq_models_ab
SHARE_END=560 share_steps 1,64
echo "== the fastest persistent shape per case, before -> now (us)"
python3 - $OUT/run$R-tune-prev.txt $OUT/run$R-tune-full.txt <<'PY'
import re, sys
def best(f):
    d = {}
    for l in open(f):
        m = re.match(r"^  (awq g\d+ .*?): tiled .*persistent (\S+)(?: stream-K)? ([0-9.]+) us", l)
        if m: d[m.group(1)] = (m.group(2), float(m.group(3)))
    return d
a, b = best(sys.argv[1]), best(sys.argv[2])
for k, (s, t) in b.items():
    p = a.get(k)
    print(f"{k[:70]:70} {p[1] if p else float('nan'):8.1f} -> {t:8.1f} {s}")
PY
