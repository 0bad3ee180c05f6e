#!/bin/bash
# run 108 (two GPUs: nvidia-h200-x2 or nvidia-h100-x2): the one-shot all-reduce over peer memory
# (`CLEAVE_ALLREDUCE=nccl|peer[:BYTES]`, peer up to 2 MB by default) against NCCL's.
#   collectives: `kernels-check --no-ops --nccl` (the KV transfer, then the engine's collectives
#           beside raw NCCL: sums checked before and after the timing; single calls and 50 back to
#           back).
#   ids:    greedy ids at float32 of one GPU against TP2 (graphs, peer all-reduce), TP2 with
#           NCCL's, and TP2 eager: a random tiny bf16 model and two V3-shape AWQ layers with 64
#           routed experts (TP2+EP).
#   group:  `kernels-check --bench-model` over both GPUs, 16 V3 layers in AWQ with 64 routed
#           experts (dummy weights), TP2+EP, decode at batch 1/64 (context 2048), eager and from
#           CUDA graphs, peer then NCCL.
# `[PARTS="coll ids group"] bash kernels/bench/run108-peer.sh [RUN]`
source kernels/bench/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=$(date +%s); R=${1:-108}; PARTS=${PARTS:-coll ids group}
part() { [[ " $PARTS " == *" $1 "* ]]; }
nvidia-smi -L | head -2; nvidia-smi topo -m | head -4
if part coll; then
  timeout 150 $C kernels-check --no-ops --nccl > $OUT/run$R-coll.txt 2>&1
  echo "collectives rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run$R-coll.txt)"
  grep -A30 "^collectives on 2 GPUs" $OUT/run$R-coll.txt | grep -E "all-reduce|operation"
  grep -iE "error|panic|differ" $OUT/run$R-coll.txt | head -5 | cut -c1-200
fi
if part ids; then
  gen_model tinyb --shape tiny --dtype bf16
  gen_model v3l2 --shape v3-layers --layers 2 --routed-experts 64 --dtype awq
  mkdir -p /tmp/g; rm -rf /tmp/g/*
  for m in tinyb v3l2; do
    ep=; [ $m = v3l2 ] && ep=--enable-expert-parallel
    greedy_ids /tmp/g/$m-one.json --model /dev/shm/$m
    greedy_ids /tmp/g/$m-peer.json --model /dev/shm/$m --tensor-parallel-size 2 $ep
    CLEAVE_ALLREDUCE=nccl greedy_ids /tmp/g/$m-nccl.json --model /dev/shm/$m --tensor-parallel-size 2 $ep
    greedy_ids /tmp/g/$m-eager.json --model /dev/shm/$m --tensor-parallel-size 2 $ep --enforce-eager
  done
  echo "ids done $(( $(date +%s) - S )) s"
  ids_compare /tmp/g peer nccl eager | tee $OUT/run$R-ids.txt
  rm -rf /dev/shm/tinyb* /dev/shm/v3l2*
fi
if part group; then
  $C gen-checkpoint --config-only --shape v3-layers --layers 16 --routed-experts 64 --dtype awq --out /tmp/v3l16 > /dev/null
  for ar in peer nccl; do
    CLEAVE_ALLREDUCE=$ar timeout 150 $C kernels-check --no-ops --bench-model /tmp/v3l16 --load-format dummy --ctx 2048 \
      --batches 1,64 --prefill 0 --tensor-parallel-size 2 --enable-expert-parallel > $OUT/run$R-group-$ar.txt 2>&1
    echo "group $ar rc=$? $(( $(date +%s) - S )) s"
    grep -E "decode|profiled" $OUT/run$R-group-$ar.txt | cut -c1-330
    grep -iE "error|panic" $OUT/run$R-group-$ar.txt | head -3 | cut -c1-200
  done
fi
