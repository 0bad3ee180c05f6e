#!/bin/bash
# run 206 (one GPU): HEAD's quick pass (golden fixtures, tiny-r1, tiny-r1-awq; graphs against
# eager), then the presence and frequency penalties on the CUDA backend, whose rows are sampled
# on the host from downloaded logits: `cleave generate` at float32 with both penalties, CUDA
# against the CPU reference, token ids and logprobs. `timeout 300 bash
# kernels/bench/run206-penalties.sh` with HEAD's build as .carry/cleave.gz.
# Not run yet: session 39's calls for it got no machine (H100 and H200, five tries).
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-206}
nvidia-smi --query-gpu=name --format=csv,noheader
quick_checks $R
for m in tiny-r1 tiny-r1-awq; do
  args="--model models/$m --prompt-ids 5,9,13,17,21,25,29,33 --max-tokens 24 --ignore-eos --presence-penalty 0.7 --frequency-penalty 0.9 --output json"
  timeout 90 $C generate --device cuda --dtype float32 $args 2> $OUT/run$R-$m-cuda.err | tail -1 > $OUT/run$R-$m-cuda.json
  timeout 90 $C generate $args 2> /dev/null | tail -1 > $OUT/run$R-$m-cpu.json
  timeout 90 $C generate --device cuda --dtype float32 ${args/--presence-penalty 0.7 --frequency-penalty 0.9/} 2> /dev/null | tail -1 > $OUT/run$R-$m-plain.json
  python3 - $OUT/run$R-$m-cuda.json $OUT/run$R-$m-cpu.json $OUT/run$R-$m-plain.json $m <<'PY'
import json, sys
try:
    a, b, c = (json.load(open(p)) for p in sys.argv[1:4])
except Exception as e:
    print(f"{sys.argv[4]}: NO OUTPUT ({e})"); sys.exit(0)
d = max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]))
print(f"{sys.argv[4]}: penalties on CUDA vs CPU ids {'equal' if a['token_ids'] == b['token_ids'] else 'DIFFER'} "
      f"({len(a['token_ids'])} tokens), max |dlogprob| {d:.2e}; without penalties the ids "
      f"{'differ' if c['token_ids'] != a['token_ids'] else 'are the same'}")
PY
done
grep -iE "error|panic" $OUT/run$R-*-cuda.err | head -3
(cd $OUT && tar czf run$R.tgz run$R-* && rm -f run$R-*.txt run$R-*.json run$R-*.err)
