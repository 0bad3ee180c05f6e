#!/bin/bash
# run 5 (nvidia-h200-x2): the script of bench/results/run5-1p1d-nccl.txt; expects stripped release
# binaries in .carry/ (cargo build --release -p cleave -p cleave-bench) and writes $OUT/log.
# 1P1D on 2 H200s: NCCL check, cleave serve over NCCL, a streaming request, cleave-bench, metrics.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH NCCL_NVLS_ENABLE=0
export CLEAVE_KERNEL_CACHE=/tmp/cleave-kernels
B=.carry; L=$OUT/log
log() { echo "=== $* [$(date +%T)]" | tee -a $L; }
chmod +x $B/cleave $B/cleave-bench
log "GPUs"; nvidia-smi -L 2>&1 | tee -a $L
log "(a) kernels-check --no-ops --nccl"
timeout 100 $B/cleave kernels-check --no-ops --nccl 2>&1 | tee -a $L; echo "rc=${PIPESTATUS[0]}" | tee -a $L
log "(b) cleave serve --config configs/h200-1p1d.yaml --port 0"
RUST_LOG=info $B/cleave serve --config configs/h200-1p1d.yaml --port 0 > $OUT/serve.log 2>&1 &
SP=$!
URL=""
for i in $(seq 1 180); do
  URL=$(grep -o 'ready at http://[^ ]*' $OUT/serve.log | head -1 | sed 's/ready at //; s/0\.0\.0\.0/127.0.0.1/')
  [ -n "$URL" ] && break
  kill -0 $SP 2>/dev/null || break
  sleep 0.5
done
grep -E 'ready at|error|Error|rank loaded|communicator up|KV cache sized|GPU open' $OUT/serve.log | cut -c1-300 | tee -a $L
if [ -z "$URL" ]; then log "server did not come up"; tail -40 $OUT/serve.log | tee -a $L; kill $SP 2>/dev/null; exit 1; fi
log "streaming chat request (short prompt: decode_local)"
timeout 20 curl -sN $URL/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"model":"tiny-r1","messages":[{"role":"user","content":"What is 1234 plus 4321?"}],"stream":true,"max_tokens":400,"temperature":0}' 2>&1 | tee -a $L
LONG=$(python3 -c "print(' '.join(['What is 12 plus 34?']*70) + ' What is 1234 plus 4321?')")
log "streaming chat request (long prompt: prefill route, KV over NCCL)"
timeout 20 curl -sN $URL/v1/chat/completions -H 'Content-Type: application/json' \
  -d "{\"model\":\"tiny-r1\",\"messages\":[{\"role\":\"user\",\"content\":\"$LONG\"}],\"stream\":true,\"max_tokens\":48,\"temperature\":0,\"stream_options\":{\"include_usage\":true}}" 2>&1 | tail -c 2500 | tee -a $L
echo | tee -a $L
curl -s $URL/metrics | grep -E '^cleave_(kv_transfer|router_requests)' | tee -a $L
log "cleave-bench"
timeout 100 $B/cleave-bench --base-url $URL --endpoint /v1/chat/completions --num-prompts 40 --max-concurrency 8 \
  --random-input-len 600 --random-output-len 64 --ignore-eos --disable-tqdm 2>&1 | tee -a $L; echo "rc=${PIPESTATUS[0]}" | tee -a $L
log "metrics"
curl -s $URL/metrics | grep -E '^cleave_(kv_transfer|router_requests|rank_restarts|recomputes|requests_finished)' | tee -a $L
kill $SP 2>/dev/null; sleep 1; kill -9 $SP 2>/dev/null
grep -ciE 'warn|error' $OUT/serve.log | sed 's/^/serve.log warn|error lines: /' | tee -a $L
grep -iE 'warn|error' $OUT/serve.log | head -20 | cut -c1-300 | tee -a $L
log "(c) summary"
{
g() { grep -m1 "$1" $L | sed "s/^ *//"; }
echo "| what | value |"; echo "|---|---|"
echo "| raw NCCL | $(g 'raw NCCL, one') |"
echo "| 4k-token KV cache-to-cache | $(g 'KV blocks, cache to cache') |"
echo "| KvLink protocol | $(g 'engine KvLink protocol') |"
echo "| KvLink recovery | $(g 'abandoned transfer:') |"
echo "| NCCL init without its peer | $(g 'communicator init whose peer') |"
echo "| bench ok/failed | $(g 'Successful requests') / $(g 'Failed requests') |"
echo "| bench throughput | $(g 'Request throughput') ; $(g 'Output token throughput') |"
echo "| bench TTFT/TPOT | $(g 'Mean TTFT') ; $(g 'Mean TPOT') |"
echo "| kv_transfers_total | $(grep '^cleave_kv_transfers_total' $L | tail -1) |"
echo "| kv_transfer_bytes | $(grep '^cleave_kv_transfer_bytes_total' $L | tail -1) |"
echo "| kv_transfer_seconds | $(grep '^cleave_kv_transfer_seconds_total' $L | tail -1) |"
echo "| routes | $(grep '^cleave_router_requests_total' $L | tail -2 | tr '\n' ' ') |"
} | tee -a $L
