#!/bin/bash
# run 48 (one GPU): dense linears of 1-8 rows on the GEMV kernel (q and kv_a in one launch) and
# MLA's prologue (q RoPE, latent RMSNorm + RoPE, cache write, q's bf16 copy) as one kernel. The
# quick pass with golden fixtures and tiny-r1; the full linear and attention stages (GEMV vs
# cuBLAS, fused vs separate prologue); then the bf16 V2-Lite decode at batch 1/4/8/64/256, new
# defaults and the previous kernels (CLEAVE_DENSE_GEMV=off CLEAVE_MLA_PROLOGUE=separate) in the
# same run.
source kernels/bench/lib.sh
S=$(date +%s)
$C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1 &
GP=$!
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run48-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run48-checks.txt)"
grep -iE "fail|panic|graphs vs eager|over tol" $OUT/run48-checks.txt | cut -c1-150 | head -14
timeout 150 $C kernels-check --stages linear,attention > $OUT/run48-stages.txt 2>&1
echo "stages rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run48-stages.txt)"
grep -E "linear|mla_prologue|fail|panic" $OUT/run48-stages.txt | cut -c1-160 | head -40
wait $GP
for mode in new old; do
  if [ $mode = old ]; then export CLEAVE_DENSE_GEMV=off CLEAVE_MLA_PROLOGUE=separate; fi
  timeout 170 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,4,8,64,256 --prefill 0 > $OUT/run48-v2lite-$mode.txt 2>&1
  echo "bench $mode rc=$? $(( $(date +%s) - S )) s"
  grep -E "^ +[0-9]+ +[0-9.]+ |CUDA graph|profile decode batch 1|rror" $OUT/run48-v2lite-$mode.txt | cut -c1-330
done
rm -rf /dev/shm/v2lite
