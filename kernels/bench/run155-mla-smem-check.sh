#!/bin/bash
# run 155 (one GPU): the seesaw v4 checking its dynamic shared memory against the size it needs
# (a trap if the launcher's, written in Rust too, were short): the attention stage with v4 named
# and the quick pass.
# `timeout 300 bash kernels/bench/run155-mla-smem-check.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-155}
nvidia-smi --query-gpu=name --format=csv,noheader
attention_check v4 CLEAVE_MLA_DECODE=v4
quick_checks $R
