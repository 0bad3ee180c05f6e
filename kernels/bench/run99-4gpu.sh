#!/bin/bash
# run 99 (nvidia-h200-x4; it came as 4 H100s): run 98 again after its two findings, with the
# routed experts cut to 64 per layer (94 GB) so that the model fits four H100s: run 98 timed out
# on 4 H100s (the full 375 GB cannot fit them) and its TP4 generate runs hung: ranks that do not
# sample produced no logits in the captured step, which the capture took for a failure.
#   ids:   greedy ids of one GPU against TP4 and TP4+EP (now replaying CUDA graphs with their
#          NCCL all-reduces) and DP4+EP (eager), at float32: a random tiny bf16 model and two
#          V3-shape AWQ layers with 64 routed experts.
#   group: `kernels-check --bench-model` over the four GPUs: decode at batch 1/64/256 (context
#          2048), eager and from CUDA graphs, and a 4,096-token prefill; TP4+EP (MODE=tp), DP4+EP
#          (MODE=dp). The checkpoint stays in /dev/shm for the next call while the machine is warm.
# `MODE=tp|dp bash kernels/bench/run99-4gpu.sh [RUN]`; the ids run with MODE=tp.
source kernels/bench/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=$(date +%s); R=${1:-99}; MODE=${MODE:-tp}; M=v3awq61x64
nvidia-smi -L | head -4; free -g | head -2; df -BG /dev/shm | tail -1
pkill -x cleave; rm -rf /dev/shm/v3awq61 /dev/shm/v3awq61.done /dev/shm/v3awq61full* /dev/shm/tinyb*
[ -f /dev/shm/$M.done ] && echo "the full checkpoint is still here" || {
  ( S0=$(date +%s); gen_model $M --shape v3-layers --layers 61 --routed-experts 64 --dtype awq
    echo "gen 61 layers x 64 experts done after $(( $(date +%s) - S0 )) s, $(du -sh /dev/shm/$M | cut -f1)" ) & }
if [ $MODE = tp ]; then
  gen_model tinyb --shape tiny --dtype bf16
  gen_model v3l2 --shape v3-layers --layers 2 --routed-experts 64 --dtype awq
  mkdir -p /tmp/g
  g() { local out=$1; shift; RUST_LOG=info timeout 60 $C generate --device cuda --dtype float32 --output json --ignore-eos --prompt-ids 5,9,13,17,21,25,29,33 --max-tokens 24 "$@" 2>/tmp/gen.err | tail -1 > $out || { echo "FAILED: $*"; grep -iE "error|panic" /tmp/gen.err | tail -3; }; grep -E "captured decode" /tmp/gen.err | tail -1 | cut -c1-200; }
  rm -rf /tmp/g/*
  g /tmp/g/tinyb-one.json --model /dev/shm/tinyb
  g /tmp/g/tinyb-tp4.json --model /dev/shm/tinyb --tensor-parallel-size 4
  g /tmp/g/tinyb-dp4ep.json --model /dev/shm/tinyb --data-parallel-size 4 --enable-expert-parallel
  g /tmp/g/v3l2-one.json --model /dev/shm/v3l2
  g /tmp/g/v3l2-tp4ep.json --model /dev/shm/v3l2 --tensor-parallel-size 4 --enable-expert-parallel
  g /tmp/g/v3l2-tp4eager.json --model /dev/shm/v3l2 --tensor-parallel-size 4 --enable-expert-parallel --enforce-eager
  rm -rf /dev/shm/tinyb* /dev/shm/v3l2*
  echo "ids done $(( $(date +%s) - S )) s"
  python3 - <<'PY' | tee $OUT/run99-ids.txt
import glob, json, os
for one in sorted(glob.glob("/tmp/g/*-one.json")):
    base = one[:-len("-one.json")]
    try: a = json.load(open(one))
    except Exception: print(os.path.basename(base), "one GPU: NO OUTPUT"); continue
    for lay in ("tp4", "tp4ep", "tp4eager", "dp4ep"):
        try: b = json.load(open(f"{base}-{lay}.json"))
        except Exception: print(f"{os.path.basename(base):8} {lay:8} NO OUTPUT"); continue
        lps = [abs(x - y) for x, y in zip(a.get("logprobs", []), b.get("logprobs", []))]
        print(f"{os.path.basename(base):8} {lay:8} ids {'equal' if a['token_ids'] == b['token_ids'] else 'DIFFER'} ({len(a['token_ids'])} tokens), max |dlogprob| {max(lps) if lps else float('nan'):.2e}")
PY
fi
while [ ! -f /dev/shm/$M.done ]; do sleep 1; done
ls /dev/shm/$M | wc -l; du -sh /dev/shm/$M; free -g | head -2
LEFT=$(( ${BUDGET:-470} - ($(date +%s) - S) )); echo "bench gets $LEFT s"
case $MODE in tp) A="--tensor-parallel-size 4 --enable-expert-parallel";; dp) A="--data-parallel-size 4 --enable-expert-parallel";; esac
timeout $LEFT $C kernels-check --no-ops --bench-model /dev/shm/$M --ctx 2048 --batches 1,64,256 --prefill 4096 $A > $OUT/run$R-$MODE.txt 2>&1
echo "bench $MODE rc=$? $(( $(date +%s) - S )) s"
grep -vE "module|blocks per SM|^device|INFO" $OUT/run$R-$MODE.txt | tail -24 | cut -c1-420
