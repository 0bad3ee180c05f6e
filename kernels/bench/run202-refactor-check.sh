#!/bin/bash
# run 202 (one GPU): the quick pass (golden fixtures at f32 against the CPU, tiny-r1 and
# tiny-r1-awq through graphs against eager) on the build after session 37 made every launcher
# over raw device addresses an unsafe fn (about 190 call sites in the CUDA backend and
# kernels-check changed; CI runs none of them). `timeout 400 bash kernels/bench/run202-refactor-check.sh`
# with the current source as .carry/cleave-prev.gz.
# Ran on a84b4a3, one H100, session 37: all checks within tolerance (results/run202.tgz).
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-202}
nvidia-smi --query-gpu=name --format=csv,noheader
C=$P quick_checks $R
(cd $OUT && tar czf run$R.tgz run$R-*.txt && rm run$R-*.txt)
