#!/bin/bash
# run 136 (one GPU): four resident blocks an SM for the 8-row AWQ decode GEMMs only (qgp8_*, 128
# registers; the FP8 and 16-row AWQ instances as before, run 135 having made V2-Lite's FP8 and
# AWQ steps slower with four), against the build before ($P): AWQ and FP8 V2-Lite, four V3
# layers in AWQ, then the 61-layer V3 AWQ share at batches 1 and 64 with both builds.
# `timeout 575 bash kernels/bench/run136-qgp8-occupancy.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-136}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v2awq --shape v2-lite --dtype awq; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64; gen_model v2fp8 --shape v2-lite --dtype fp8 ) &
timeout 100 $C kernels-check --quick --compare-model models/tiny-r1-awq > $OUT/run$R-checks-awq.txt 2>&1
echo "checks awq rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-checks-awq.txt)"
grep -iE "fail|panic|graphs vs eager|over tol" $OUT/run$R-checks-awq.txt | head -4 | cut -c1-160
for m in v2awq:1,16,64 v3l4:1,8,64 v2fp8:1; do ab_steps ${m%:*} ${m#*:}; done
SHARE_END=390 share_steps 1,64
C=$P R=${R}p SHARE_END=570 share_steps 1,64
