#!/bin/bash
# (Measured and dropped: that build was reverted after this run; kernels/NOTES.md, "MLA decode v4".)
# run 142 (one GPU): MLA decode v4 with both warpgroups computing every score of a tile (one
# barrier a tile instead of three; the probabilities handed to P.V in registers, wgmma's A from
# registers), against the build before ($P, run 141's: scores split by keys between the
# warpgroups, maxima and probabilities exchanged in shared memory).
#   attention: kernels-check's attention stage with v4 named (every case on v4, 16 and 32 heads
#              padding its block) against the CPU, timed.
#   steps: four V3 layers in AWQ (64 experts) at batches 1, 64 and 256, both builds; the
#          61-layer one-GPU share at 1 and 64 with this build.
#   checks: the quick pass (golden fixtures, tiny-r1).
# `timeout 575 bash kernels/bench/run142-mla-v4-rs.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-142}
nvidia-smi --query-gpu=name --format=csv,noheader
( gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 ) &
$P kernels-check --quick --stages sample > $OUT/run$R-prev-compile.txt 2>&1 &
CLEAVE_MLA_DECODE=v4 timeout 150 $C kernels-check --stages attention --default-variants > $OUT/run$R-attn-v4.txt 2>&1
echo "attention v4 rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-attn-v4.txt)"
grep -iE "fail|panic|over tol|error" $OUT/run$R-attn-v4.txt | head -5 | cut -c1-200
grep -E "blocks per SM" $OUT/run$R-attn-v4.txt | tail -1
grep -E "^mla_attention.*decode.*(V3|TP4)" $OUT/run$R-attn-v4.txt | cut -c1-170
wait
BENCH_TIMEOUT=60 ab_steps v3l4 1,64,256
grep -hE "profile decode batch (64|256)" $OUT/run$R-v3l4-new.txt $OUT/run$R-v3l4-prev.txt | cut -c1-200
SHARE_END=480 share_steps 1,64
grep -E "profile decode batch 64" $OUT/run$R-v3-61.txt | cut -c1-330
timeout 90 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run$R-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-checks.txt)"
grep -iE "fail|panic|over tol" $OUT/run$R-checks.txt | cut -c1-160 | head -6
