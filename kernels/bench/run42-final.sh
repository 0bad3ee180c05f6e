#!/bin/bash
# run 42 (one GPU), the session's final binary: the experts stage (32-row default 32x64/64/3/0
# against the CPU), the quick pass, golden fixtures and tiny-r1 with graphs vs eager; the bf16
# V2-Lite decode at batch 1/16/64/256 (eager and CUDA graphs) with the 4096-token prefill; a
# served V2-Lite-free tiny-r1 with max_num_seqs 256 (capture time and memory) and --enforce-eager.
source kernels/bench/lib.sh
$C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1 &
GP=$!
timeout 250 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run42-checks.txt 2>&1
echo "checks rc=$? $(tail -1 $OUT/run42-checks.txt)"; grep -iE "fail|panic|graphs vs eager" $OUT/run42-checks.txt | cut -c1-120 | head -14
timeout 100 $C kernels-check --stages experts > $OUT/run42-experts.txt 2>&1
echo "experts rc=$? $(tail -1 $OUT/run42-experts.txt)"; grep -E "moe_experts v2 " $OUT/run42-experts.txt | cut -c1-150
wait $GP
timeout 200 $C kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,16,64,256 > $OUT/run42-v2lite.txt 2>&1
echo "bench rc=$?"; grep -E "^ +[0-9]+ +[0-9.]+ |CUDA graph|^  [0-9.]+ ms, |rror" $OUT/run42-v2lite.txt | cut -c1-200
rm -rf /dev/shm/v2lite
start_server $OUT/run42-serve.txt models/tiny-r1 --device cuda --port 8123 --max-num-seqs 256
curl -s localhost:8123/v1/completions -H 'content-type: application/json' -d '{"model":"tiny-r1","prompt":"12+7=","max_tokens":16,"temperature":0}' | head -c 300; echo
kill $SP; wait $SP 2>/dev/null
start_server $OUT/run42-serve-eager.txt models/tiny-r1 --device cuda --port 8124 --enforce-eager
curl -s localhost:8124/v1/completions -H 'content-type: application/json' -d '{"model":"tiny-r1","prompt":"12+7=","max_tokens":16,"temperature":0}' | head -c 300; echo
kill $SP; wait $SP 2>/dev/null
grep -hE "captured|cuda rank loaded|WARN|ERROR" $OUT/run42-serve.txt $OUT/run42-serve-eager.txt | cut -c1-250 | head
