#!/bin/bash
# run 87 (one GPU): run 86's MLA absorb kernels (c6bb1f5, never run) and MLA's two input
# projections stacked into one compressed weight (one decode GEMM, one split-K reduction that
# cuts the result in two; FP8: one activation quantization). Three binaries travel gzipped:
# cleave-old (0e6e664, before the absorb kernels), cleave-mid (c6bb1f5) and cleave (this commit).
#   checks: the quick pass (golden fixtures, tiny-r1; then tiny-r1-awq) with graphs vs eager, the
#           attention stage (few-row absorb cases) and the qdecode stage (linear_split rows).
#   steps:  whole decode steps from CUDA graphs, the binaries in the same run: bf16 V2-Lite old /
#           mid (and mid with CLEAVE_MLA_ABSORB=off), AWQ and FP8 V2-Lite and four V3 layers in
#           AWQ mid / new.
# `bash kernels/bench/run87-stacked.sh checks|steps [RUN]`.
for z in .carry/*.gz; do [ -f "${z%.gz}" ] || gunzip -k "$z"; done
source kernels/bench/lib.sh
O=.carry/cleave-old M=.carry/cleave-mid; chmod +x $O $M
S=$(date +%s); R=${2:-87}
if [ "$1" = checks ]; then
  quick_checks $R
  timeout 200 $C kernels-check --stages attention,qdecode > $OUT/run${R}-stages.txt 2>&1
  echo "stages rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-stages.txt)"
  grep -E "few rows|linear_split|over tol|linear awq g64 persistent|linear fp8 b128 persistent" $OUT/run${R}-stages.txt | cut -c1-160 | head -40
fi
if [ "$1" = steps ]; then
  # Ten result files: written beside, returned as one archive (a call returns eight files).
  D=$OUT; OUT=/tmp/run${R}; mkdir -p $OUT
  ( gen_model v2lite --shape v2-lite; gen_model v2awq --shape v2-lite --dtype awq
    gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64; gen_model v2fp8 --shape v2-lite --dtype fp8 ) &
  GP=$!
  bench_steps v2lite-old $O v2lite 1,2,4,8,64
  bench_steps v2lite-mid $M v2lite 1,2,4,8,64
  bench_steps v2lite-off $M v2lite 1,4 CLEAVE_MLA_ABSORB=off
  grep -E "profile decode batch 1" $OUT/run${R}-v2lite-mid.txt | cut -c1-400
  rm -rf /dev/shm/v2lite*
  bench_steps v2awq-mid $M v2awq 1,8,64
  bench_steps v2awq-new $C v2awq 1,8,64
  grep -E "profile decode batch 1" $OUT/run${R}-v2awq-new.txt | cut -c1-400
  bench_steps v3l4-mid $M v3l4 1,8,64
  bench_steps v3l4-new $C v3l4 1,8,64
  bench_steps v2fp8-mid $M v2fp8 1,8,64
  bench_steps v2fp8-new $C v2fp8 1,8,64
  wait $GP
  rm -rf /dev/shm/v2lite* /dev/shm/v2awq* /dev/shm/v3l4* /dev/shm/v2fp8*
  tar czf $D/run${R}-steps.tgz -C $OUT .
fi
