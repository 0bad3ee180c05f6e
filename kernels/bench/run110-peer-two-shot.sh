#!/bin/bash
# run 110 (nvidia-h100-x4): run 109 again with the two-shot peer all-reduce (over 512 KB on more
# than two ranks) and the peer kernel up to 8 MB (batch 256 of V3's hidden state), first the
# engine's collectives on four ranks against raw NCCL (`kernels-check --no-ops --nccl`: exact sums
# checked before and after timing), then the TP4+EP group (peer, then NCCL) and the tiny model's
# ids; the quick pass on GPU 0 last if time is left.
# `timeout 570 bash kernels/bench/run110-peer-two-shot.sh [RUN]`
source kernels/bench/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=$(date +%s); R=${1:-110}
nvidia-smi -L | head -4
timeout 150 $C kernels-check --no-ops --nccl > $OUT/run$R-coll.txt 2>&1
echo "collectives rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-coll.txt)"
grep -A40 "^collectives on" $OUT/run$R-coll.txt | grep -E "all-reduce|AllReduce|operation"
grep -iE "error|panic|differ" $OUT/run$R-coll.txt | head -5 | cut -c1-200
$C gen-checkpoint --config-only --shape v3-layers --layers 61 --routed-experts 64 --dtype awq --out /tmp/v3x64 > /dev/null
for ar in peer nccl; do
  CLEAVE_ALLREDUCE=$ar timeout 150 $C kernels-check --no-ops --bench-model /tmp/v3x64 --load-format dummy --ctx 2048 \
    --batches 1,64,256 --prefill 0 --tensor-parallel-size 4 --enable-expert-parallel > $OUT/run$R-group-$ar.txt 2>&1
  echo "group $ar rc=$? $(( $(date +%s) - S )) s"
  grep -E "decode|profiled" $OUT/run$R-group-$ar.txt | grep -v "graph replay" | grep -v "^  module\|blocks per SM" | cut -c1-300
  grep -iE "error|panic" $OUT/run$R-group-$ar.txt | head -3 | cut -c1-200
done
gen_model tinyb --shape tiny --dtype bf16
mkdir -p /tmp/g; rm -rf /tmp/g/*
g() { local out=$1; shift; timeout 60 $C generate --device cuda --dtype float32 --output json --ignore-eos --prompt-ids 5,9,13,17,21,25,29,33 --max-tokens 24 "$@" 2>/tmp/gen.err | tail -1 > $out || { echo "FAILED: $*"; grep -iE "error|panic" /tmp/gen.err | tail -3 | cut -c1-200; }; }
greedy_ids /tmp/g/tinyb-one.json --model /dev/shm/tinyb
greedy_ids /tmp/g/tinyb-tp4.json --model /dev/shm/tinyb --tensor-parallel-size 4
ids_compare /tmp/g tp4 | tee $OUT/run$R-ids.txt
echo "ids done $(( $(date +%s) - S )) s"
[ $(( $(date +%s) - S )) -lt 380 ] && quick_checks $R
echo "done $(( $(date +%s) - S )) s"
