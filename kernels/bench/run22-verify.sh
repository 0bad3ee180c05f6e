#!/bin/bash
# run 22 (one GPU): what the 2026-11-24 session built without a GPU to check it on. Expects the
# stripped release binary in .carry/.
# 1. Every parallel layout and the TP2 -> DP2+EP hand-off, now over the groups' KV ports (the
#    engine path of transfers between GPU groups, host copies in place of NCCL), three checkpoints.
# 2. The FP8 prefill stage with its byte check of `qbytes_fp8` against the checkpoint (added after
#    run 21 measured this kernel).
# On nvidia-h200-x2, run kernels/bench/run20-2gpu.sh too: its 1P1D serve moves KV over NCCL
# through the same engine path (Engine::send_kv / poll_kv on each side's KvLink port).
source kernels/bench/lib.sh
for m in models/golden/bf16-qlora models/golden/f32-noqlora models/tiny-r1; do
  echo "== $m"
  timeout 200 $C kernels-check --no-ops --parallel-model $m 2>&1 | grep -E "^  [a-z]|tie|DIFF|rror|within|failed" | grep -v "module\|mla_decode"
done
timeout 240 $C kernels-check --stages fp8_prefill > $OUT/fp8.txt 2>&1; echo "fp8_prefill rc=$?"
grep -E "fp8|qbytes|act_quant|cublaslt|FAIL|failed|rror|panic" $OUT/fp8.txt | cut -c1-150
# BENCH=1: the V2-Lite bf16 decode with each kernel's share at batch 1, 64 and 256 (issue 15's
# batch-256 step: what falls from 62% to 40% of HBM).
if [ -n "$BENCH" ]; then
  $C gen-checkpoint --shape v2-lite --dtype bf16 --out /dev/shm/v2lite-bf16 > /dev/null 2>&1
  timeout 180 $C kernels-check --no-ops --bench-model /dev/shm/v2lite-bf16 --batches 1,64,256 > $OUT/bench-v2lite.txt 2>&1
  echo "bench rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ |profile decode" $OUT/bench-v2lite.txt | cut -c1-400
  rm -rf /dev/shm/v2lite-bf16
fi
