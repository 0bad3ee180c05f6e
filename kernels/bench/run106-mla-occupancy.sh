#!/bin/bash
# run 106 (one GPU): the MLA decode at 32 heads per block held to 128 registers (two blocks per
# SM) against $P (the same build without that bound), and the AWQ expansion by rows with 16 or
# 32 k-tiles per block.
#   checks: the quick pass (golden fixtures, tiny-r1, tiny-r1-awq), then the expand stage (every
#           expansion kernel bit for bit against the per-value one, timed).
#   attention: kernels-check's attention stage, default kernels only, for both builds: the
#           128-head and 32-head decode rows side by side.
#   prefill: one 4,096-token prompt on four V3 layers AWQ with 256 experts (128 rows per expert)
#           with the expansion off, at 64 rows and at the default; V2-Lite AWQ at the default.
#           The loads time the host repacking.
# Run 105's script with the expand stage alone and the default attention kernels only:
# `bash kernels/bench/run106-mla-occupancy.sh [RUN]`
QUANT_STAGE=expand ATTN_FLAGS=--default-variants exec bash kernels/bench/run105-mla-expand.sh ${1:-106}
