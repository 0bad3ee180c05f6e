#!/bin/bash
# run 110 (nvidia-h100-x4): run 109 again with the two-shot peer all-reduce (over 512 KB on more
# than two ranks) and the peer kernel up to 8 MB (batch 256 of V3's hidden state), first the
# engine's collectives on four ranks against raw NCCL (`kernels-check --no-ops --nccl`: exact sums
# checked before and after timing), then run 109's script (the TP4+EP group, peer then NCCL, and
# the tiny model's ids); the quick pass on GPU 0 last if time is left.
# `timeout 570 bash kernels/bench/run110-peer-two-shot.sh [RUN]`
source kernels/bench/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=$(date +%s); R=${1:-110}
nvidia-smi -L | head -4
timeout 150 $C kernels-check --no-ops --nccl > $OUT/run$R-coll.txt 2>&1
echo "collectives rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-coll.txt)"
grep -A40 "^collectives on" $OUT/run$R-coll.txt | grep -E "all-reduce|AllReduce|operation"
grep -iE "error|panic|differ" $OUT/run$R-coll.txt | head -5 | cut -c1-200
bash kernels/bench/run109-peer-tp4.sh $R
[ $(( $(date +%s) - S )) -lt 380 ] && quick_checks $R
echo "done $(( $(date +%s) - S )) s"
