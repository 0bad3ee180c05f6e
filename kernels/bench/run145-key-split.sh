#!/bin/bash
# run 145 (one GPU): the split decode kernels' shared key_split helper (common.cuh): kernels-check's
# attention stage under the default kernels (v4 at 128 heads, v3 at 16 and 32, v2 for the odd
# dims) against the CPU, and the golden fixtures' quick pass.
# `timeout 200 bash kernels/bench/run145-key-split.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-145}
timeout 110 $C kernels-check --stages attention --default-variants > $OUT/run$R-attn.txt 2>&1
echo "attention rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-attn.txt)"
grep -iE "fail|panic|over tol|error" $OUT/run$R-attn.txt | head -5 | cut -c1-200
grep -E "^mla_attention.*decode V3 heads: 64 seqs" $OUT/run$R-attn.txt | cut -c1-170
timeout $(( 195 - ($(date +%s) - S) )) $C kernels-check --quick --golden models/golden > $OUT/run$R-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-checks.txt)"
