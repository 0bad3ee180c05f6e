#!/bin/bash
# run 101 (one GPU): prefill's AWQ experts expanded to bf16 per call and run on the bf16 wgmma
# grouped GEMM (CLEAVE_AWQ_PREFILL, default from 64 rows per expert) against the int4 tiled
# kernel's 64-row tiles (CLEAVE_AWQ_PREFILL=off), same binary.
#   checks: the quick pass (golden fixtures, tiny-r1, tiny-r1-awq), then meant the full quant
#           stage, but `--no-ops` below skips every per-op stage, so it ran none (run 105 ran it).
#   prefill: one 4,096-token prompt on V2-Lite AWQ, four V3 layers AWQ with 64 and with 256 routed
#           experts (dummy weights from config-only directories), off and on.
# `[SKIP_QUICK=1] bash kernels/bench/run101-awq-prefill.sh [RUN]` (run 103: SKIP_QUICK=1).
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-101}
nvidia-smi --query-gpu=name --format=csv,noheader
[ -n "$SKIP_QUICK" ] || quick_checks $R
timeout 150 $C kernels-check --no-ops --stages quant > $OUT/run$R-quant.txt 2>&1
echo "quant stage rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-quant.txt)"
grep -E "moe_experts awq.*4096|over tol|FAIL" $OUT/run$R-quant.txt | cut -c1-200 | head -8
$C gen-checkpoint --config-only --shape v2-lite --dtype awq --out /tmp/v2awq > /dev/null
$C gen-checkpoint --config-only --shape v3-layers --dtype awq --routed-experts 64 --out /tmp/v3x64 > /dev/null
$C gen-checkpoint --config-only --shape v3-layers --dtype awq --out /tmp/v3x256 > /dev/null
for m in v2awq v3x64 v3x256; do
  for mode in off ""; do
    CLEAVE_AWQ_PREFILL=$mode timeout 90 $C kernels-check --no-ops --bench-model /tmp/$m --load-format dummy --batches 1 --prefill 4096 > $OUT/run$R-$m-${mode:-on}.txt 2>&1
    echo "$m ${mode:-on} rc=$? $(( $(date +%s) - S )) s: $(grep -A1 'prefill of one' $OUT/run$R-$m-${mode:-on}.txt | tail -1 | tr -s ' ' | cut -c1-150)"
    grep -E "profile prefill" $OUT/run$R-$m-${mode:-on}.txt | cut -c1-300; grep -iE "error|panic" $OUT/run$R-$m-${mode:-on}.txt | head -3 | cut -c1-200
  done
done
