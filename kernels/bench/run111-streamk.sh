#!/bin/bash
# run 111 (one GPU): stream-K for the persistent compressed decode GEMMs (CLEAVE_QGEMM_STREAMK,
# on by default): every block streams an equal run of k-tiles, an item cut between blocks is
# finished by the block holding its first k-tile; dense GEMMs lose their split-K reduction kernel
# and the stacked projections are cut in the GEMM's own epilogue.
#   checks: registers of the persistent GEMMs (cuobjdump), the quick pass (golden fixtures,
#           tiny-r1, tiny-r1-awq: graphs vs eager), the qdecode stage (every AWQ/FP8 linear,
#           stacked pair and expert GEMM against the CPU) with stream-K on and off, then
#           qgemm_tune (each shape with whole items and with stream-K).
#   steps:  whole decode steps with stream-K on and off in the same run: V2-Lite AWQ and FP8,
#           four V3 layers in AWQ (64 experts).
# Runs 111-113 used stream-K on more GEMMs than the final default (docs/benchmarks.md, "Stream-K for
# the compressed decode GEMMs"); this script runs whatever the binary's default is.
# `bash kernels/bench/run111-streamk.sh checks|steps [RUN]` (steps also runs the quick pass and
# the qdecode stage; run 112 was `steps` after the hand-over's batched reads; run 113
# `NO_CHECKS=1 MODELS="v2awq v3l4" REPEAT=1 ... steps 113` with stream-K for AWQ only).
source kernels/bench/lib.sh
S=$(date +%s); R=${2:-111}
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = checks ]; then
  quick_checks $R
  for f in $CLEAVE_KERNEL_CACHE/qdecode-*.cubin; do
    cuobjdump --dump-resource-usage $f 2>/dev/null | grep -A1 -E "qgp8_awq_256_64_4_(f32|silu)|qgp_awq_256_64_4_f32|qgp64_awq_64_64_4_f32|qgp_fp8_128_128_4_f32" \
      | grep -oE "Function [a-z0-9_]+|REG:[0-9]+|STACK:[0-9]+" | paste -sd' ' | sed 's/Function/\n/g'
  done
  for sk in on off; do
    CLEAVE_QGEMM_STREAMK=$sk timeout 150 $C kernels-check --stages qdecode > $OUT/run$R-qdecode-$sk.txt 2>&1
    echo "qdecode streamk=$sk rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run$R-qdecode-$sk.txt)"
    grep -iE "over tol|fail|panic" $OUT/run$R-qdecode-$sk.txt | head -5 | cut -c1-170
  done
  timeout 330 $C kernels-check --stages qgemm_tune > /tmp/tune.txt 2>&1; echo "tune rc=$? $(( $(date +%s) - S )) s"
  grep -iE "over tol|failed|panic" /tmp/tune.txt | head -3 | cut -c1-170
  sed -n '/^qgemm_tune:/,$p' /tmp/tune.txt > $OUT/run$R-tune.txt
  grep -E "^(qg tiled|qgp) " /tmp/tune.txt | cut -c1-160 > $OUT/run$R-tune-rows.txt
  echo "== default shapes, whole items vs stream-K (us, % HBM)"
  grep -E "awq g64 (8x)?256/64/4 |fp8 g128 128/128/4 " $OUT/run$R-tune-rows.txt | grep -E " (1|16|64) (rows|tok)" \
    | awk '{$NF=""; print}' | tr -s ' ' | cut -c1-150
fi
if [ "$1" = steps ]; then
  ( gen_model v2awq --shape v2-lite --dtype awq; gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64
    [[ "${MODELS:-v2fp8}" == *v2fp8* ]] && gen_model v2fp8 --shape v2-lite --dtype fp8 ) &
  if [ -z "$NO_CHECKS" ]; then
  quick_checks $R
  timeout 150 $C kernels-check --stages qdecode > $OUT/run$R-qdecode.txt 2>&1
  echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run$R-qdecode.txt)"
  grep -iE "over tol|fail|panic" $OUT/run$R-qdecode.txt | head -5 | cut -c1-170
  fi
  for m in ${MODELS:-v2awq v3l4 v2fp8}; do
    bt=1,16,64,256; [ $m = v3l4 ] && bt=1,8,64
    BENCH_TIMEOUT=80 bench_steps $m-on $C $m $bt
    BENCH_TIMEOUT=80 bench_steps $m-off $C $m $bt CLEAVE_QGEMM_STREAMK=off
    [ -n "$REPEAT" ] && BENCH_TIMEOUT=80 bench_steps $m-on2 $C $m $bt
    rm -rf /dev/shm/$m /dev/shm/$m.done
  done
fi
