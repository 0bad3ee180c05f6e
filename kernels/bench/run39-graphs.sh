#!/bin/bash
# run 39 (one GPU): CUDA graphs for decode steps (issue 15 item 1). Checks: the MLA kernels with
# per-row splits (`--quick --stages attention`), the golden fixtures and tiny-r1 with graphs
# (CPU vs CUDA, and graphs vs eager steps); the bf16 V2-Lite decode at batch 1/16/64/256 eager
# and replayed; a served tiny-r1 that captures at start-up.
source kernels/bench/lib.sh
$C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1 &
GP=$!
timeout 240 $C kernels-check --quick --stages attention,elementwise --golden models/golden --compare-model models/tiny-r1 > $OUT/run39-checks.txt 2>&1
echo "checks rc=$? $(tail -1 $OUT/run39-checks.txt)"; grep -iE "fail|over|panic|graphs vs eager|error" $OUT/run39-checks.txt | head -30
wait $GP
timeout 200 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,16,64,256 > $OUT/run39-v2lite.txt 2>&1
echo "bench rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ |enqueue|CUDA graph|rror" $OUT/run39-v2lite.txt | cut -c1-200
rm -rf /dev/shm/v2lite
start_server $OUT/run39-serve.txt models/tiny-r1 --device cuda --port 8123 --max-num-seqs 32
curl -s localhost:8123/v1/completions -H 'content-type: application/json' -d '{"model":"tiny-r1","prompt":"12+7=","max_tokens":16,"temperature":0}' | head -c 400; echo
kill $SP; wait $SP 2>/dev/null
grep -E "captured|graph|cuda rank loaded|WARN|ERROR" $OUT/run39-serve.txt | cut -c1-250 | head
