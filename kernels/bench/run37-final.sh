#!/bin/bash
# run 37 (one GPU), the session's last record (issue 15 targets at the bf16 V2-Lite shape):
# end-to-end checks of the final binary (`--quick`, golden fixtures, tiny-r1 CPU vs CUDA), the
# bf16 V2-Lite decode at batch 1/64/256 with a 4096-token prefill, and the PyTorch eager peer.
source kernels/bench/lib.sh
$C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1 &
GP=$!
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run37-checks.txt 2>&1
echo "checks rc=$? $(tail -1 $OUT/run37-checks.txt)"; grep -iE "fail|over tol|panic" $OUT/run37-checks.txt | head -5
wait $GP
timeout 150 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,64,256 > $OUT/run37-v2lite.txt 2>&1
echo "bench rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ |enqueue|^  [0-9.]+ ms, " $OUT/run37-v2lite.txt | cut -c1-130
grep -oE "profile decode batch [0-9]+: kernels [0-9.]+ ms: [^,]+, [^,]+, [^,]+, [^,]+" $OUT/run37-v2lite.txt
rm -rf /dev/shm/v2lite
timeout 150 python3 kernels/bench/torch_peer.py --batches 1,64 --prompt 1024 > $OUT/run37-torch-peer.txt 2>&1
echo "peer rc=$?"; grep -E "^batch" $OUT/run37-torch-peer.txt
