#!/bin/bash
# run 19 (one GPU): the real model's decode, one GPU's share (issue 12): all 61 layers of the V3
# shape in AWQ int4 (group 64) with 64 of the 256 routed experts per layer, what one GPU of a
# 4-way expert-parallel group holds. Generated into /dev/shm (host memory, not disk), then
# `kernels-check --bench-model` at context 2048. If /dev/shm cannot hold 61 layers, as many
# layers as fit are generated and the run says so.
source kernels/bench/lib.sh
free -g | head -2; df -BG /dev/shm | tail -1
AVAIL=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)
LAYERS=${LAYERS:-61}
# About 1.67 GB per layer at this shape (plus 1.9 GB of embeddings and lm_head).
FIT=$(( (AVAIL - 6) * 100 / 167 )); [ $FIT -lt $LAYERS ] && { echo "only $AVAIL GB in /dev/shm: $FIT layers"; LAYERS=$FIT; }
S=$(date +%s)
$C gen-checkpoint --shape v3-layers --layers $LAYERS --routed-experts 64 --dtype awq --out /dev/shm/v3awq > /tmp/gen.txt 2>&1
echo "gen $LAYERS layers rc=$? $(( $(date +%s) - S )) s: $(tail -1 /tmp/gen.txt)"
timeout 450 $C kernels-check --no-ops --bench-model /dev/shm/v3awq --ctx 2048 --batches ${BATCHES:-1,64,128} --prefill 0 > /tmp/b.txt 2>&1
echo "bench rc=$? $(( $(date +%s) - S )) s"
grep -vE "step ms by|allocations|compiled|module" /tmp/b.txt | tail -22
cp /tmp/b.txt $OUT/run19-bench.txt
