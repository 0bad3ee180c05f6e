#!/bin/bash
# run 119 (nvidia-h100-x4): stream-K on a TP4+EP group: the 61-layer V3 shape in AWQ with 64
# routed experts per layer (runs 99 and 109's model, which fits four H100s; dummy weights), each
# rank holding 16 experts, decode at batch 1/64/256 (context 2048), eager and from CUDA graphs,
# with stream-K on (the default) and off; then greedy ids of a tiny model, one GPU against TP4.
# `timeout 570 bash kernels/bench/run119-tp4-streamk.sh [RUN]`
source kernels/bench/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=$(date +%s); R=${1:-119}
nvidia-smi -L | head -4
for sk in on off; do group_steps $sk 1,64,256 CLEAVE_QGEMM_STREAMK=$sk; done
gen_model tinyb --shape tiny --dtype bf16
mkdir -p /tmp/g; rm -rf /tmp/g/*
greedy_ids /tmp/g/tinyb-one.json --model /dev/shm/tinyb
greedy_ids /tmp/g/tinyb-tp4.json --model /dev/shm/tinyb --tensor-parallel-size 4
ids_compare /tmp/g tp4 | tee $OUT/run$R-ids.txt
echo "done $(( $(date +%s) - S )) s"
