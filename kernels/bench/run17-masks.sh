#!/bin/bash
# run 17 (one GPU): structured-output masks in the CUDA sampler. kernels-check's sampling stage
# (masked rows against the CPU reference, vocab 129,280), tool calling on tiny-r1 served on the GPU,
# then run 15's measurement again (V2-Lite shape: none / regex / JSON schema at 1 and 64 concurrent).
source kernels/bench/lib.sh
timeout 240 $C kernels-check --stages sample > /tmp/ks.txt 2>&1; echo "kernels-check sample rc=$?"; grep -i "sample" /tmp/ks.txt | tail -8
start_server /tmp/tiny.txt models/tiny-r1 --device cuda --port 18300
timeout 120 python3 kernels/bench/tools_check.py http://127.0.0.1:18300 > /tmp/tools.txt 2>&1; echo "tools rc=$?"; tail -3 /tmp/tools.txt
kill $SP; wait $SP 2>/dev/null
bash kernels/bench/run15-structured.sh
