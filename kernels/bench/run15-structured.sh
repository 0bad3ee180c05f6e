#!/bin/bash
# run 15 (one GPU): structured outputs at a real vocabulary. The V2-Lite shape (random weights,
# gen-checkpoint's 102,400-token tokenizer) served by `cleave serve`; cleave-bench at 1 and 64
# concurrent requests without a constraint, with a regex (vLLM's guided_regex) and with a JSON
# schema (guided_json): the decode cost of llguidance's masks and of sampling constrained rows
# on the host.
source kernels/bench/lib.sh
$C gen-checkpoint --shape v2-lite --dtype bf16 --out /dev/shm/v2lite > /tmp/gen.txt 2>&1 || { tail -3 /tmp/gen.txt; exit 1; }
U=http://127.0.0.1:18200
start_server /tmp/serve.txt /dev/shm/v2lite --device cuda --max-model-len 4096 --max-num-seqs 256 --port 18200
REGEX='{"guided_regex": "[a-zA-Z0-9 ,.]+"}'
JSON='{"guided_json": {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}}, "required": ["text", "n"]}}'
t0=$(date +%s%N)
curl -s $U/v1/completions -H 'Content-Type: application/json' -d "{\"model\":\"v2lite\",\"prompt\":\"Hello\",\"max_tokens\":4,$(echo $JSON | sed 's/^{//; s/}$//')}" | head -c 300; echo
echo "first constrained request (builds the vocabulary index): $(( ($(date +%s%N) - t0) / 1000000 )) ms"
for c in 1 64; do
  n=$(( c == 1 ? 16 : 128 ))
  for mode in none regex json; do
    case $mode in none) X='{}';; regex) X=$REGEX;; json) X=$JSON;; esac
    timeout 150 $CB --base-url $U --endpoint /v1/completions --num-prompts $n --max-concurrency $c \
      --random-input-len 1024 --random-output-len 128 --ignore-eos --extra-body "$X" --save-result $OUT/c$c-$mode.json > /tmp/b.txt 2>&1
    echo "c=$c $mode rc=$? $(grep -E 'Successful|Output token throughput|Median TPOT|Median ITL|P99 ITL|Median TTFT' /tmp/b.txt | awk -F: '{gsub(/ +/," ",$2); printf "%s:%s |", $1, $2}')"
  done
done
curl -s $U/v1/completions -H 'Content-Type: application/json' -d "{\"model\":\"v2lite\",\"prompt\":\"Hello\",\"max_tokens\":40,\"temperature\":0.8,$(echo $JSON | sed 's/^{//; s/}$//')}" | head -c 400; echo
kill $SP; wait $SP 2>/dev/null
grep -iE "panic|error" /tmp/serve.txt | head -5
