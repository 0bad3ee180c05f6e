#!/bin/bash
# run 100 (nvidia-h200-x4 with needs_h200): the full DeepSeek-V3/R1 shape in AWQ g64 (61 layers,
# all 256 routed experts, ~375 GB) as one TP4+EP group on four H200s, its weights made in memory
# by `--load-format dummy` from a config-only directory (`gen-checkpoint --config-only`): no
# 375 GB file, which neither /dev/shm nor the disk of the machine holds.
#   MODE=bench: `kernels-check --bench-model` over the group: decode at batch 1/64/256 (context
#               2048), eager and from CUDA graphs, and a 4,096-token prefill.
#   MODE=serve: `cleave serve` of the same model (TP4+EP, graphs) over HTTP, measured with
#               cleave-bench at concurrency 1/16/64/256 (1,024-token prompts, 256 output tokens).
# `MODE=bench|serve timeout 560 bash kernels/bench/run100-r1-dummy.sh [RUN]`
source kernels/bench/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=$(date +%s); R=${1:-100}; MODE=${MODE:-bench}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -4; nproc; free -g | head -2
pkill -x cleave
$C gen-checkpoint --shape v3-layers --layers 61 --dtype awq --config-only --out /tmp/r1 | tail -1
python3 -c "import json; c=json.load(open('/tmp/r1/config.json')); print({k: c[k] for k in ('num_hidden_layers','n_routed_experts','first_k_dense_replace','quantization_config')})"
A="--tensor-parallel-size 4 --enable-expert-parallel"
if [ $MODE = bench ]; then
  LEFT=$(( ${BUDGET:-540} - ($(date +%s) - S) )); echo "bench gets $LEFT s"
  RUST_LOG=info timeout $LEFT $C kernels-check --no-ops --bench-model /tmp/r1 --load-format dummy --ctx 2048 \
    --batches 1,64,256 --prefill 4096 $A > $OUT/run$R-bench.txt 2>&1
  echo "bench rc=$? $(( $(date +%s) - S )) s"
  grep -E "loading" $OUT/run$R-bench.txt | grep "rank=0" | tail -2 | cut -c1-200
  grep -vE "module|blocks per SM|^device|INFO" $OUT/run$R-bench.txt | tail -26 | cut -c1-420
else
  $C serve /tmp/r1 --load-format dummy --device cuda $A --max-model-len 4096 --max-num-seqs 256 \
    --gpu-memory-utilization 0.92 --port 18200 > $OUT/run$R-serve.txt 2>&1 &
  SP=$!
  while ! grep -q "ready at" $OUT/run$R-serve.txt; do kill -0 $SP 2>/dev/null || break; sleep 1; done
  echo "serve ready after $(( $(date +%s) - S )) s"; grep -E "ready|rror|captured|KV cache" $OUT/run$R-serve.txt | head -8 | cut -c1-250
  U=http://127.0.0.1:18200
  curl -s $U/v1/completions -H 'Content-Type: application/json' -d '{"model":"r1","prompt":"Hello","max_tokens":8}' | head -c 300; echo
  for c in 1 16 64 256; do
    n=$(( c < 8 ? 8 : c * 2 )); [ $c = 256 ] && n=256
    LEFT=$(( ${BUDGET:-540} - ($(date +%s) - S) )); [ $LEFT -lt 30 ] && break
    timeout $LEFT $CB --base-url $U --endpoint /v1/completions --num-prompts $n --max-concurrency $c \
      --random-input-len 1024 --random-output-len 256 --ignore-eos --save-result $OUT/run$R-c$c.json > $OUT/run$R-bench-c$c.txt 2>&1
    echo "c=$c rc=$? $(( $(date +%s) - S )) s $(grep -E 'Output token throughput|Median TPOT|Median ITL|P99 ITL|Median TTFT' $OUT/run$R-bench-c$c.txt | awk -F: '{gsub(/ +/," ",$2); printf "%s:%s |", $1, $2}')"
  done
  kill $SP; wait $SP 2>/dev/null
  grep -iE "panic|error" $OUT/run$R-serve.txt | head -5 | cut -c1-250
fi
free -g | head -2
