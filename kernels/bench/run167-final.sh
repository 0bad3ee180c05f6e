#!/bin/bash
# run 167 (one GPU): the session's final build (the kernels of 843cc39, QPersist's operand kind as
# the QMma enum) against 843cc39's ($P): the quick pass (golden fixtures, tiny-r1, tiny-r1-awq,
# graphs against eager), then four V3 layers and V2-Lite in AWQ with both builds.
# `timeout 400 bash kernels/bench/run167-final.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-167}
nvidia-smi --query-gpu=name --format=csv,noheader
awq_models_gen
$P kernels-check --quick --stages sample > /dev/null 2>&1 &
quick_checks $R
wait
awq_models_ab
