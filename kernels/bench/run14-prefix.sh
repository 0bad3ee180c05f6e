#!/bin/bash
# run 14 (one GPU): prefix caching. kernels-check runs the golden fixtures and prompts sharing a
# prefix with caching on and off on the CUDA kernels; then the V2-Lite shape (random weights,
# gen-checkpoint) is served by `cleave serve` with caching on, then off, in the same run, and
# measured with cleave-bench: the R1 chat pattern (`multi-turn`: a shared 2k-token system prompt,
# 10-turn conversations) and vLLM's prefix_repetition dataset.
source kernels/bench/lib.sh
({ time $C gen-checkpoint --shape v2-lite --dtype bf16 --out /dev/shm/v2lite; } > $OUT/gen.txt 2>&1) &
GP=$!
timeout 200 $C kernels-check --no-ops --golden models/golden --compare-model models/tiny-r1 \
  --prefix-cache-model models/golden/bf16-qlora --prefix-cache-model models/tiny-r1 > $OUT/check.txt 2>&1
echo "kernels-check rc=$?"; grep -E "^  |within|failed|FAIL|cache" $OUT/check.txt | grep -v module | tail -25
wait $GP; grep -E "real|wrote" $OUT/gen.txt
U=http://127.0.0.1:18200
for mode in on off; do
  flag=""; [ $mode = off ] && flag="--no-enable-prefix-caching"
  echo "== caching $mode"
  start_server /tmp/serve-$mode.txt /dev/shm/v2lite --device cuda --max-model-len 8192 --max-num-seqs 256 --port 18200 $flag
  timeout 240 $CB multi-turn --base-url $U --num-conversations 32 --turns 10 --system-prompt-len 2000 \
    --user-len 64 --output-len 128 --max-concurrency 16 --save-result $OUT/mt-$mode.json > $OUT/mt-$mode.txt 2>&1
  echo "multi-turn rc=$?"; grep -E ":" $OUT/mt-$mode.txt | grep -vE "^saved|conversations x" | tail -12
  timeout 150 $CB --base-url $U --endpoint /v1/completions --dataset-name prefix_repetition \
    --prefix-repetition-prefix-len 2048 --prefix-repetition-suffix-len 128 --prefix-repetition-num-prefixes 8 \
    --prefix-repetition-output-len 128 --num-prompts 256 --max-concurrency 64 --save-result $OUT/pr-$mode.json > $OUT/pr-$mode.txt 2>&1
  echo "prefix_repetition rc=$? $(grep -E 'Output token throughput|Median TTFT|P99 TTFT|Median ITL|P99 ITL' $OUT/pr-$mode.txt | awk -F: '{gsub(/ +/," ",$2); printf "%s:%s |", $1, $2}')"
  curl -s $U/metrics | grep -E "^cleave_prefix_cache_(hits|queries|evictions)_total|^cleave_prefix_cache_blocks" | sed 's/{.*}//'
  kill $SP; wait $SP 2>/dev/null
  grep -iE "panic|error" /tmp/serve-$mode.txt | head -3
done
