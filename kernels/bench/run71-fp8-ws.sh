#!/bin/bash
# run 71 (one GPU): the FP8 wgmma expert GEMM made persistent and warp-specialized (a cp.async
# producer warpgroup, two consumer warpgroups on mbarriers). Checks: kernels-check's qdecode
# stage (FP8 experts at 1024 tokens on the wgmma kernel against the CPU) and the quick pass.
# Bench: the 4096-token prefill of FP8 V2-Lite and four FP8 V3 layers, old binary (run 60's
# kernel) against the new one at its default and 4 stages, per-kernel profile. Run 74 repeats it
# after the paired scales and the descriptor adds (`bash kernels/bench/run71-fp8-ws.sh 74`), run
# 76 after the 128 x 256 tiles (`... 76 3`: the second stage count 3).
source kernels/bench/lib.sh
R=run${1:-71}
S=$(date +%s)
timeout 240 $C kernels-check --stages qdecode > $OUT/$R-qdecode.txt 2>&1
echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/$R-qdecode.txt)"
grep -E "moe_experts fp8" $OUT/$R-qdecode.txt | cut -c1-150 | head -9
timeout 200 $C kernels-check --quick > $OUT/$R-quick.txt 2>&1
echo "quick rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/$R-quick.txt)"
grep -iE "over tol|fail|panic|error" $OUT/$R-quick.txt | grep -v "see note" | head -5
$C gen-checkpoint --shape v2-lite --dtype fp8 --out /dev/shm/v2fp8 > /dev/null 2>&1
$C gen-checkpoint --shape v3-layers --dtype fp8 --out /dev/shm/v3fp8 > /dev/null 2>&1
for m in v3fp8 v2fp8; do
  for b in old new new4; do
    f=$OUT/$R-$m-$b.txt
    case $b in
      old) bin=.carry/cleave-old; env= ;;
      new) bin=$C; env= ;;
      new4) bin=$C; env=CLEAVE_PREFILL_FP8=wgmma:${2:-4} ;;
    esac
    env $env timeout 150 $bin kernels-check --no-ops --bench-model /dev/shm/$m --batches 1 --prefill 4096 > $f 2>&1
    echo "$m $b rc=$? $(( $(date +%s) - S )) s: $(grep -A1 'prefill of one' $f | tail -1)"
    grep -E "profile prefill" $f | grep -oE "ggw_fp8[a-z0-9_]* [0-9.]+ms/[0-9]+" | tr '\n' ' '; echo
  done
done
rm -rf /dev/shm/v2fp8 /dev/shm/v3fp8
