#!/bin/bash
# run 21 (one GPU): FP8 prefill linears on FP8 tensor cores (issue 12). Expects the stripped
# release binary in .carry/. Quick checks of the quant stages, then the full fp8_prefill stage
# (activation quantization bit for bit; V2-Lite and V3 prefill linears against the CPU on the
# same quantized activations, timed against cuBLASLt alone and the bf16 expansion), then, time
# permitting (BUDGET seconds in all), 4 layers of the V3 shape in FP8: a 4k prefill with FP8
# tensor cores and with the bf16 expansion (CLEAVE_FP8_GEMM=bf16; VARIANTS narrows).
source kernels/bench/lib.sh
T0=$(date +%s)
left() { echo $(( ${BUDGET:-420} - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
( $C gen-checkpoint --shape v3-layers --dtype fp8 --out /dev/shm/v3l4-fp8 > $OUT/gen.txt 2>&1 ) &
GP=$!
timeout 150 $C kernels-check --quick --stages quant,fp8_prefill > $OUT/quick.txt 2>&1; echo "quick rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "quant|linear|fp8|act_quant|cublaslt|FAIL|over tol|failed|rror|panic" $OUT/quick.txt | cut -c1-160 | head -40
L=$(left); [ $L -gt 220 ] && L=220
timeout $L $C kernels-check --stages fp8_prefill > $OUT/fp8.txt 2>&1; echo "fp8_prefill rc=$? at $(( $(date +%s) - T0 )) s"
grep -E "fp8|act_quant|qbytes|cublaslt|FAIL|over tol|failed|rror|panic" $OUT/fp8.txt | cut -c1-160 | head -40
wait $GP; tail -2 $OUT/gen.txt
for v in ${VARIANTS:-tensor-cores bf16}; do
  L=$(left); [ $L -lt 40 ] && { echo "no time left for the V3 prefill ($v)"; continue; }
  [ $L -gt 100 ] && L=100
  CLEAVE_FP8_GEMM=$v timeout $L $C kernels-check --no-ops --bench-model /dev/shm/v3l4-fp8 --ctx 2048 --batches 1 > $OUT/bench-$v.txt 2>&1
  echo "v3l4 fp8 prefill ($v) rc=$? at $(( $(date +%s) - T0 )) s"
  grep -E "loaded in|prefill|tensor cores|cublas|qbytes|act_quant|qdequant" $OUT/bench-$v.txt | cut -c1-200 | head -20
done
rm -rf /dev/shm/v3l4-fp8
