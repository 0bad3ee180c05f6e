#!/bin/bash
# run 107 (nvidia-h200-x4 with needs_h200): run 100's full R1 shape (AWQ g64, 256 experts, TP4+EP,
# dummy weights) after runs 105-106: the AWQ expansion by rows (prefill experts from 96 rows per
# expert, so R1's 4k prefill at 128 rows per expert on EP4 takes it; the attention projections
# past 128 rows), two MLA decode blocks of 32 heads per SM, and the one-read AWQ repacking at
# load. The quick pass first (golden fixtures, tiny-r1, tiny-r1-awq on GPU 0).
# `timeout 570 bash kernels/bench/run107-r1-4gpu.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-107}
quick_checks $R
MODE=bench BUDGET=$(( 560 - ($(date +%s) - S) )) bash kernels/bench/run100-r1-dummy.sh $R
