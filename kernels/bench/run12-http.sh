#!/bin/bash
# run 12 (one GPU): the tie-aware parallel check on golden bf16-qlora, then a random-weight
# V2-Lite (bf16) checkpoint from gen-checkpoint (now with a tokenizer) served over HTTP by
# `cleave serve MODEL --device cuda` and measured with cleave-bench, as vllm bench serve would.
source kernels/bench/lib.sh
({ time $C gen-checkpoint --shape v2-lite --dtype bf16 --out /dev/shm/v2lite; } > $OUT/gen.txt 2>&1) &
GP=$!
timeout 200 $C kernels-check --no-ops --golden models/golden --compare-model models/tiny-r1 --parallel-model models/golden/bf16-qlora 2>&1 | grep -E "^  |^    |within|failed" | grep -v module
wait $GP; grep -E "real|wrote" $OUT/gen.txt; ls /dev/shm/v2lite
start_server $OUT/serve.txt /dev/shm/v2lite --device cuda --max-model-len 4096 --max-num-seqs 256 --port 18200
grep -E "ready|rror" $OUT/serve.txt | head -5
U=http://127.0.0.1:18200
curl -s $U/v1/completions -H 'Content-Type: application/json' -d '{"model":"v2lite","prompt":"Hello","max_tokens":8}' | head -c 300; echo
for c in 1 16 64 128; do
  n=$(( c < 16 ? 16 : c * 2 ))
  timeout 200 $CB --base-url $U --endpoint /v1/completions --num-prompts $n --max-concurrency $c \
    --random-input-len 1024 --random-output-len 128 --ignore-eos --save-result $OUT/c$c.json > $OUT/bench-c$c.txt 2>&1
  echo "c=$c rc=$? $(grep -E 'Output token throughput|Median TPOT|P99 TPOT|Median ITL|P99 ITL|Median TTFT' $OUT/bench-c$c.txt | awk -F: '{gsub(/ +/," ",$2); printf "%s:%s |", $1, $2}')"
done
kill $SP; wait $SP 2>/dev/null
grep -iE "panic|error" $OUT/serve.txt | head -5
