#!/bin/bash
# run 20 (nvidia-h200-x2): issue 14's two-GPU checks. Greedy ids of every golden fixture at
# float32 and of tiny-r1 at bf16 from one GPU, a TP2 group, a TP2+EP group and a DP2+EP group
# (`cleave generate --device cuda`: ranks on GPUs 0-1 over NCCL), then run 5 again: the KV
# transfer check (`kernels-check --nccl`) and configs/h200-1p1d.yaml serving with its KV over NCCL.
source kernels/bench/lib.sh
export NCCL_NVLS_ENABLE=0
nvidia-smi -L
gen() { local out=$1; shift; timeout 120 $C generate --device cuda --output json --ignore-eos "$@" 2>/tmp/gen.err | tail -1 > $out || { echo "FAILED: $*"; tail -3 /tmp/gen.err; }; }
mkdir -p /tmp/g
S=$(date +%s)
for m in bf16-qlora f32-noqlora fp8-blocks awq-g128 awq-g64-attn16; do
  A="--model models/golden/$m --dtype float32 --prompt-ids 5,9,13,17,21,25,29,33 --max-tokens 24"
  gen /tmp/g/$m-one.json $A
  gen /tmp/g/$m-tp2.json $A --tensor-parallel-size 2
  gen /tmp/g/$m-tp2ep.json $A --tensor-parallel-size 2 --enable-expert-parallel
  gen /tmp/g/$m-dp2ep.json $A --data-parallel-size 2 --enable-expert-parallel
done
for i in 0 1 2 3; do
  P=("What is 347 + 589?" "Compute 1200 - 457." "What is 15 minus 2300?" "9999 + 9999")
  A=(--model models/tiny-r1 --chat --prompt "${P[$i]}" --max-tokens 200)
  gen /tmp/g/tiny$i-one.json "${A[@]}"
  gen /tmp/g/tiny$i-tp2.json "${A[@]}" --tensor-parallel-size 2
  gen /tmp/g/tiny$i-dp2ep.json "${A[@]}" --data-parallel-size 2 --enable-expert-parallel
done
echo "generate runs: $(( $(date +%s) - S )) s"
python3 - <<'PY'
import glob, json, os
def load(p):
    try: return json.load(open(p))
    except Exception as e: return None
for one in sorted(glob.glob("/tmp/g/*-one.json")):
    base = one[:-len("-one.json")]
    a = load(one)
    for lay in ("tp2", "tp2ep", "dp2ep"):
        p = f"{base}-{lay}.json"
        if not os.path.exists(p): continue
        b = load(p)
        if a is None or b is None:
            print(f"{os.path.basename(base):16} {lay:6} MISSING OUTPUT"); continue
        same = a["token_ids"] == b["token_ids"]
        lps = [abs(x - y) for x, y in zip(a.get("logprobs", []), b.get("logprobs", []))]
        print(f"{os.path.basename(base):16} {lay:6} ids {'equal' if same else 'DIFFER'} ({len(a['token_ids'])} tokens), max |dlogprob| {max(lps) if lps else float('nan'):.2e}"
              + ("" if same else f"\n   one {a['token_ids'][:12]}\n   {lay} {b['token_ids'][:12]}"))
PY
head -c 300 /tmp/g/tiny0-tp2.json; echo
bash kernels/bench/run5-1p1d.sh > /dev/null 2>&1; echo "run5 rc=$?"
grep -E "^===|rc=|Output token throughput|Successful|Median ITL|P99 ITL|kv_transfer_(bytes|total|seconds_count)|ok|GB/s" $OUT/log | cut -c1-200 | head -40
