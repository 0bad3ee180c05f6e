#!/bin/bash
# run 97 (nvidia-h200-x4 or -h100-x4): issue 14's 4-GPU items.
#   ids:   greedy ids of one GPU against TP4, TP4+EP and DP4+EP (`cleave generate --device cuda`,
#          ranks on GPUs 0-3 over NCCL): a random tiny bf16 model and two V3-shape layers in AWQ
#          (64 routed experts), both at float32.
#   group: all 61 layers of the V3 shape in AWQ g64 (64 of the 256 routed experts per layer, for
#          load time) as one group over the four GPUs (`kernels-check --bench-model ...
#          --tensor-parallel-size 4 --enable-expert-parallel`, or DP4+EP with MODE=dp): decode
#          steps at batch 1/64/256, context 2048, and a 4,096-token prefill.
# `MODE=tp|dp|both bash kernels/bench/run97-4gpu.sh [RUN]`; ids run with MODE=tp or both.
source kernels/bench/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=$(date +%s); R=${1:-97}; MODE=${MODE:-both}
nvidia-smi -L; nvidia-smi topo -m | head -6; free -g | head -2; df -BG /dev/shm | tail -1
[ -f /dev/shm/v3awq61.done ] && echo "the 61-layer checkpoint is still here" || {
  ( S0=$(date +%s); gen_model v3awq61 --shape v3-layers --layers 61 --routed-experts 64 --dtype awq
    echo "gen 61 layers done after $(( $(date +%s) - S0 )) s" ) & }
if [ $MODE != dp ]; then
  gen_model tinyb --shape tiny --dtype bf16
  gen_model v3l2 --shape v3-layers --layers 2 --routed-experts 64 --dtype awq
  mkdir -p /tmp/g
  g() { local out=$1; shift; timeout 120 $C generate --device cuda --dtype float32 --output json --ignore-eos --prompt-ids 5,9,13,17,21,25,29,33 --max-tokens 24 "$@" 2>/tmp/gen.err | tail -1 > $out || { echo "FAILED: $*"; tail -3 /tmp/gen.err; }; }
  for m in tinyb v3l2; do
    g /tmp/g/$m-one.json --model /dev/shm/$m
    g /tmp/g/$m-tp4.json --model /dev/shm/$m --tensor-parallel-size 4
    g /tmp/g/$m-tp4ep.json --model /dev/shm/$m --tensor-parallel-size 4 --enable-expert-parallel
    g /tmp/g/$m-dp4ep.json --model /dev/shm/$m --data-parallel-size 4 --enable-expert-parallel
  done
  rm -rf /dev/shm/tinyb* /dev/shm/v3l2*
  echo "ids done $(( $(date +%s) - S )) s"
  python3 - <<'PY' | tee $OUT/run97-ids.txt
import glob, json, os
for one in sorted(glob.glob("/tmp/g/*-one.json")):
    base = one[:-len("-one.json")]
    try: a = json.load(open(one))
    except Exception: print(os.path.basename(base), "one GPU: NO OUTPUT"); continue
    for lay in ("tp4", "tp4ep", "dp4ep"):
        try: b = json.load(open(f"{base}-{lay}.json"))
        except Exception: print(f"{os.path.basename(base):8} {lay:6} NO OUTPUT"); continue
        lps = [abs(x - y) for x, y in zip(a.get("logprobs", []), b.get("logprobs", []))]
        print(f"{os.path.basename(base):8} {lay:6} ids {'equal' if a['token_ids'] == b['token_ids'] else 'DIFFER'} ({len(a['token_ids'])} tokens), max |dlogprob| {max(lps) if lps else float('nan'):.2e}")
PY
fi
while [ ! -f /dev/shm/v3awq61.done ]; do sleep 1; done
ls /dev/shm/v3awq61 | wc -l; du -sh /dev/shm/v3awq61
bench() {
  timeout ${BENCH_TIMEOUT:-280} $C kernels-check --no-ops --bench-model /dev/shm/v3awq61 --ctx 2048 --batches 1,64,256 --prefill 4096 "$@" > $OUT/run$R-$tag.txt 2>&1
  echo "bench $tag rc=$? $(( $(date +%s) - S )) s"
  grep -vE "module|blocks per SM|^device" $OUT/run$R-$tag.txt | tail -16 | cut -c1-400
}
[ $MODE != dp ] && { tag=tp4ep; bench --tensor-parallel-size 4 --enable-expert-parallel; }
[ $MODE != tp ] && { tag=dp4ep; bench --data-parallel-size 4 --enable-expert-parallel; }
echo "total $(( $(date +%s) - S )) s"
