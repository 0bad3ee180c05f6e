#!/bin/bash
# run 191 (one GPU): the 61-layer V3 AWQ share (one GPU's, dummy weights) at batches 1, 16 and 64
# with the dense AWQ GEMMs on stream-K (`CLEAVE_QGEMM_STREAMK=all`) and on split-K (experts, the
# default), HEAD's build, one load each.
# `timeout 570 bash kernels/bench/run191-share-streamk.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-191}
nvidia-smi --query-gpu=name --format=csv,noheader
share_ab CLEAVE_QGEMM_STREAMK 1,16,64 all experts
