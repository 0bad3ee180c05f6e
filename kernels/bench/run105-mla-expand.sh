#!/bin/bash
# run 105 (one GPU): the MLA decode grid with a row's head groups adjacent and three stages at 32
# heads per block (a TP4 rank of V3), and the AWQ expansion by rows (`qdequant_awq_rows`).
#   checks: the quick pass (golden fixtures, tiny-r1, tiny-r1-awq), then the full quant stage
#           (every expansion kernel bit for bit against the per-value one, timed; AWQ experts at
#           4,096 tokens against the CPU).
#   attention: kernels-check's attention stage for this build and for $P (the build before,
#           with the same cases), the 128-head and 32-head decode rows side by side.
#   prefill: one 4,096-token prompt on four V3 layers AWQ with 256 experts (128 rows per expert)
#           with the expansion off, at 64 rows and at the default; V2-Lite AWQ at the default.
#           The loads time the host repacking.
# `[PARTS="checks quant attn prefill"] [QUANT_STAGE=expand] [ATTN_FLAGS=--default-variants] bash
# kernels/bench/run105-mla-expand.sh [RUN]` (the parts named, all by default; run 106 took the
# expand stage alone and the default attention kernels only).
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-105}; PARTS=${PARTS:-checks quant attn prefill}; QS=${QUANT_STAGE:-quant}
part() { [[ " $PARTS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name --format=csv,noheader
part checks && quick_checks $R
if part quant; then
timeout 240 $C kernels-check --stages $QS > $OUT/run$R-quant.txt 2>&1
echo "$QS stage rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-quant.txt)"
grep -E "^expand|moe_experts awq.*4096|over tol|FAIL" $OUT/run$R-quant.txt | grep -v " 136 x\| 256 x 640" | cut -c1-175 | head -24
fi
part attn && for b in new prev; do
  bin=$C; [ $b = prev ] && bin=$P
  timeout 200 $bin kernels-check --stages attention $ATTN_FLAGS > $OUT/run$R-attn-$b.txt 2>&1
  echo "attention $b rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-attn-$b.txt)"
  grep -E "over tol|FAIL|panic" $OUT/run$R-attn-$b.txt | head -5 | cut -c1-170
done
if part prefill; then
$C gen-checkpoint --config-only --shape v2-lite --dtype awq --out /tmp/v2awq > /dev/null
$C gen-checkpoint --config-only --shape v3-layers --dtype awq --out /tmp/v3x256 > /dev/null
for run in "v3x256 off" "v3x256 64" "v3x256 default" "v2awq default"; do awq_prefill $run; done
fi
if part attn; then
  echo "== MLA decode (err, tol, us, GB/s, TFLOP/s, of HBM): new, then prev"
  for b in new prev; do
    grep -E "^mla.*(decode V3 heads|decode TP4 rank)" $OUT/run$R-attn-$b.txt | sed "s/^/$b /" | tr -s ' ' | cut -c1-150
  done
fi
