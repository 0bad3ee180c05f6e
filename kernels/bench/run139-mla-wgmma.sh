#!/bin/bash
# run 139 (one GPU): MLA decode v4 (mla_decode4_h64: warpgroup MMAs, 64 heads and 64 keys a
# tile), the new default at 64 heads or more on sm_90a, against v3 in the same build
# (CLEAVE_MLA_DECODE=v3, the default before).
#   attention: kernels-check's attention stage, default kernels only, with v4 forced on every
#              case (16-head cases fill a quarter of its block), then with v3; every case
#              against the CPU; the decode rows timed.
#   steps: four V3 layers in AWQ (64 experts) at batches 1 and 64 under v4 and v3, then the
#          61-layer one-GPU share at 1 and 64 under the default (v4).
#   checks: the quick pass (golden fixtures, tiny-r1, tiny-r1-awq; graphs against eager).
# `timeout 575 bash kernels/bench/run139-mla-wgmma.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-139}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
for v in v4 v3; do
  CLEAVE_MLA_DECODE=$v timeout 120 $C kernels-check --stages attention --default-variants > $OUT/run$R-attn-$v.txt 2>&1
  echo "attention $v rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-attn-$v.txt)"
  grep -iE "fail|panic|over tol|error" $OUT/run$R-attn-$v.txt | head -5 | cut -c1-200
  grep -E "blocks per SM" $OUT/run$R-attn-$v.txt | head -6
  grep -E "decode V3 heads|decode TP4|decode: 64 seqs" $OUT/run$R-attn-$v.txt | cut -c1-170
done
BENCH_TIMEOUT=60 bench_steps v3l4-v4 $C v3l4 1,64
BENCH_TIMEOUT=60 bench_steps v3l4-v3 $C v3l4 1,64 CLEAVE_MLA_DECODE=v3
grep -E "profile decode batch 64" $OUT/run$R-v3l4-v4.txt $OUT/run$R-v3l4-v3.txt | cut -c1-330
SHARE_END=480 share_steps 1,64
grep -E "profile decode batch 64" $OUT/run$R-v3-61.txt | cut -c1-330
timeout 90 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run$R-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-checks.txt)"
grep -iE "fail|panic|over tol" $OUT/run$R-checks.txt | cut -c1-160 | head -6
