# Sourced by the run scripts (on the device machine, from the repository root): the CUDA
# libraries, the kernel cache, the carried binaries ($C, $CB, $P) and a helper that starts a server.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
export CLEAVE_KERNEL_CACHE=/tmp/cleave-kernels
# The carried binaries travel gzipped; $P is an earlier build for A/B runs, when one came along.
# Kernel variants need no build of their own: kernels/bench/variant.sh puts a commit's kernel
# sources into .carry/variants/NAME, and CLEAVE_KERNEL_SOURCES=.carry/variants/NAME in a helper's
# ENV compiles them in place of $C's embedded ones (kernels-check's module lines name them).
for z in .carry/*.gz; do [ -f "${z%.gz}" ] || gunzip -k "$z"; done
C=.carry/cleave; CB=.carry/cleave-bench; P=.carry/cleave-prev
for b in $C $CB $P; do [ -f $b ] && chmod +x $b; done

# start_server LOG ARGS...: `cleave serve ARGS` in the background (its pid in $SP); returns once
# it logged "ready at" or died, and prints how long that took.
start_server() {
  local log=$1; shift
  local t0=$(date +%s)
  $C serve "$@" > "$log" 2>&1 &
  SP=$!
  for i in $(seq 1 300); do grep -q "ready at" "$log" && break; kill -0 $SP 2>/dev/null || break; sleep 0.5; done
  echo "serve ready after $(( $(date +%s) - t0 )) s"
}

# quick_checks R: the quick pass with the golden fixtures and tiny-r1, then with tiny-r1-awq
# (graphs vs eager on every model), into $OUT/runR-checks.txt and runR-checks-awq.txt; prints
# each pass's verdict and any failing row. Times count from $S.
quick_checks() {
  local r=$1
  timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run${r}-checks.txt 2>&1
  echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run${r}-checks.txt)"
  grep -iE "fail|panic|over tol" $OUT/run${r}-checks.txt | cut -c1-160 | head -10
  timeout 120 $C kernels-check --quick --compare-model models/tiny-r1-awq > $OUT/run${r}-checks-awq.txt 2>&1
  echo "checks awq rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $OUT/run${r}-checks-awq.txt)"
  grep -iE "fail|panic|graphs vs eager|over tol" $OUT/run${r}-checks-awq.txt | cut -c1-160 | head -6
}

# attention_check TAG [ENV...]: kernels-check's attention stage (default variants) with ENV set,
# into $OUT/runR-attn-TAG.txt; prints the verdict, any failing row and the decode rows.
attention_check() {
  local f=$OUT/run$R-attn-$1.txt; shift
  env "$@" timeout 150 $C kernels-check --stages attention --default-variants > $f 2>&1
  echo "attention rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $f)"
  grep -iE "fail|panic|over tol|error" $f | head -5 | cut -c1-200
  grep -E "^mla_attention.*decode" $f | cut -c1-170
}

# bench_steps TAG BINARY MODEL BATCHES [ENV...]: decode steps of /dev/shm/MODEL (context 2,048 for
# the V3 shapes, models named v3*, else 1,024) once its generator has touched /dev/shm/MODEL.done,
# with ENV set, into $OUT/run$R-TAG.txt; prints the steps replayed from CUDA graphs. Times out
# after $BENCH_TIMEOUT seconds (default 100).
bench_steps() {
  local tag=$1 b=$2 m=$3 bt=$4 ctx=1024; shift 4
  [[ $m == v3* ]] && ctx=2048
  while [ ! -f /dev/shm/$m.done ]; do sleep 1; done
  env "$@" timeout ${BENCH_TIMEOUT:-100} $b kernels-check --no-ops --bench-model /dev/shm/$m --ctx $ctx --batches $bt --prefill 0 > $OUT/run${R}-$tag.txt 2>&1
  echo "$tag rc=$? $(( $(date +%s) - S )) s: $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run${R}-$tag.txt | grep -o '[0-9.]* ms' | tr '\n' ' ')"
}

# ab_steps MODEL BATCHES: bench_steps with this build ($C, tag MODEL-new) and the one before ($P,
# MODEL-prev), in that order (40 s each unless $BENCH_TIMEOUT says otherwise).
ab_steps() {
  BENCH_TIMEOUT=${BENCH_TIMEOUT:-40} bench_steps $1-new $C $1 $2
  BENCH_TIMEOUT=${BENCH_TIMEOUT:-40} bench_steps $1-prev $P $1 $2
}

# ncu_launches CSV: one line per launch of an `ncu --csv --print-units base` file whose metrics
# include gpu__time_duration.sum, dram__bytes_read.sum, launch__grid_size,
# launch__registers_per_thread, dram__throughput.avg.pct_of_peak_sustained_elapsed,
# smsp__issue_active.avg.pct_of_peak_sustained_active and
# sm__warps_active.avg.pct_of_peak_sustained_active (with sm__inst_executed.sum also: the
# instructions per byte read).
ncu_launches() {
  python3 - "$1" <<'PY'
import csv, sys
from collections import defaultdict
rows = defaultdict(dict)
for r in csv.DictReader([l for l in open(sys.argv[1]) if l.startswith('"')]):
    rows[int(r["ID"])]["name"] = r["Kernel Name"].split("(")[0]
    rows[int(r["ID"])][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
for i, m in sorted(rows.items()):
    t = m["gpu__time_duration.sum"] / 1e3; rd = m["dram__bytes_read.sum"] / 1e6
    print(f"  {i:3} {m['name']:28} grid {m['launch__grid_size']:5.0f} regs {m['launch__registers_per_thread']:4.0f} {t:7.2f} us"
          f" rd {rd:7.2f} MB dram {m['dram__throughput.avg.pct_of_peak_sustained_elapsed']:5.1f}%"
          f" issue {m['smsp__issue_active.avg.pct_of_peak_sustained_active']:5.1f}%"
          f" warps {m['sm__warps_active.avg.pct_of_peak_sustained_active']:5.1f}%"
          + (f" inst/B {m['sm__inst_executed.sum'] * 32 / max(rd * 1e6, 1):5.2f}" if "sm__inst_executed.sum" in m else ""))
PY
}

# gen_model NAME ARGS...: `cleave gen-checkpoint ARGS` into /dev/shm/NAME (host memory), then
# /dev/shm/NAME.done, which bench_steps waits for.
gen_model() { $C gen-checkpoint "${@:2}" --out /dev/shm/$1 > /dev/null 2>&1; touch /dev/shm/$1.done; }

# v3x30_gen: the 30-layer V3 AWQ config (64 routed experts; no weights) at /dev/shm/v3x30.
v3x30_gen() {
  $C gen-checkpoint --config-only --shape v3-layers --layers 30 --routed-experts 64 --dtype awq --out /dev/shm/v3x30 \
    > /dev/null 2>&1
}

# v3x30_steps TAG [ENV...]: CUDA-graph decode steps at batch 1-2 (or $V3X30_BATCHES) of the
# 30-layer V3 AWQ config at /dev/shm/v3x30 (`gen-checkpoint --config-only`; dummy weights, context
# 2,048) with $C (or $V3X30_BIN) into $OUT/runR-TAG.txt; prints the step times.
v3x30_steps() {
  env "${@:2}" timeout 80 ${V3X30_BIN:-$C} kernels-check --no-ops --bench-model /dev/shm/v3x30 --load-format dummy \
    --ctx 2048 --batches ${V3X30_BATCHES:-1,2} --prefill 0 > $OUT/run$R-$1.txt 2>&1
  echo "$1 rc=$? $(( $(date +%s) - S )) s: $(grep -o 'CUDA graph: step [0-9.]* ms' $OUT/run$R-$1.txt | grep -o '[0-9.]* ms' | tr '\n' ' ')"
}

# v3x30_ab BATCHES: v3x30_steps at BATCHES with this build ($C, tag v3x30-new) and the one before
# ($P, v3x30-prev).
v3x30_ab() {
  V3X30_BATCHES=$1 v3x30_steps v3x30-new
  V3X30_BATCHES=$1 V3X30_BIN=$P v3x30_steps v3x30-prev
}

# ids_run OUT ARGS...: `cleave generate --device cuda --output json ARGS` (logs at info), its JSON
# into OUT; a failure or a timeout ($IDS_TIMEOUT, default 120 s) is printed with the log's errors.
ids_run() {
  local out=$1; shift
  RUST_LOG=info timeout ${IDS_TIMEOUT:-120} $C generate --device cuda --output json "$@" > /tmp/ids.out 2> /tmp/ids.err
  local rc=$?
  tail -n 1 /tmp/ids.out > $out
  [ $rc -eq 0 ] || { echo "FAILED rc=$rc: $*"; grep -iE "error|panic" /tmp/ids.err | tail -3 | cut -c1-200; }
}

# ids_compare DIR LAYOUT...: for every DIR/NAME-one.json, NAME-LAYOUT.json's greedy ids against it
# and the largest logprob difference.
ids_compare() {
  python3 - "$@" <<'PY'
import glob, json, os, sys
d, lays = sys.argv[1], sys.argv[2:]
def load(p):
    try: return json.load(open(p))
    except Exception: return None
for one in sorted(glob.glob(f"{d}/*-one.json")):
    base = one[:-len("-one.json")]; name = os.path.basename(base); a = load(one)
    for lay in lays:
        if not os.path.exists(f"{base}-{lay}.json"): continue
        b = load(f"{base}-{lay}.json")
        if a is None or b is None: print(f"{name:10} {lay:10} NO OUTPUT ({'one GPU' if a is None else lay})"); continue
        lps = [abs(x - y) for x, y in zip(a.get("logprobs", []), b.get("logprobs", []))]
        print(f"{name:10} {lay:10} ids {'equal' if a['token_ids'] == b['token_ids'] else 'DIFFER'} ({len(a['token_ids'])} tokens), max |dlogprob| {max(lps) if lps else float('nan'):.2e}")
PY
}

# greedy_ids OUT ARGS...: `cleave generate` at float32 of 24 greedy tokens after a fixed 8-token
# prompt (ARGS name the model and layout), its JSON into OUT; a failure is printed with the log's
# errors. Compare files with ids_compare.
greedy_ids() {
  local out=$1; shift
  timeout ${IDS_TIMEOUT:-90} $C generate --device cuda --dtype float32 --output json --ignore-eos \
    --prompt-ids 5,9,13,17,21,25,29,33 --max-tokens 24 "$@" 2>/tmp/gen.err | tail -1 > $out \
    || { echo "FAILED: $*"; grep -iE "error|panic" /tmp/gen.err | tail -3 | cut -c1-200; }
}

# awq_prefill MODEL MODE: one 4,096-token prefill of /tmp/MODEL (a config-only directory, dummy
# weights) with CLEAVE_AWQ_PREFILL=MODE ("default": unset), into $OUT/run$R-MODEL-MODE.txt;
# prints the load time, the prefill line and its kernel profile.
awq_prefill() {
  local m=$1 mode=$2 f=$OUT/run$R-$1-$2.txt
  CLEAVE_AWQ_PREFILL=${mode/default/} timeout 90 $C kernels-check --no-ops --bench-model /tmp/$m --load-format dummy \
    --batches 1 --prefill 4096 > $f 2>&1
  echo "$m $mode rc=$? $(( $(date +%s) - S )) s: $(grep -o 'loaded in [0-9.]* s' $f) $(grep -A1 'prefill of one' $f | tail -1 | tr -s ' ' | cut -c1-110)"
  grep -E "profile prefill" $f | cut -c1-260; grep -iE "error|panic" $f | head -3 | cut -c1-200
}

# group_steps TAG BATCHES [ENV...]: decode steps of the 61-layer V3 shape in AWQ with 64 routed
# experts per layer (config only at /tmp/v3x64, dummy weights; it fits four H100s) as one TP4+EP
# group at context 2,048, with ENV set, into $OUT/runR-group-TAG.txt (runR-group.txt for an empty
# TAG); prints the steps, rank 0's profiles and any error. Times out after $GROUP_TIMEOUT seconds
# (default 240).
group_steps() {
  local tag=$1 bt=$2; shift 2
  local f=$OUT/run$R-group${tag:+-$tag}.txt
  [ -d /tmp/v3x64 ] || $C gen-checkpoint --config-only --shape v3-layers --layers 61 --routed-experts 64 --dtype awq \
    --out /tmp/v3x64 > /dev/null
  env "$@" timeout ${GROUP_TIMEOUT:-240} $C kernels-check --no-ops --bench-model /tmp/v3x64 --load-format dummy --ctx 2048 \
    --batches $bt --prefill 0 --tensor-parallel-size 4 --enable-expert-parallel > $f 2>&1
  echo "group ${tag:-steps} rc=$? $(( $(date +%s) - S )) s $(grep -o 'loaded in [0-9.]* s' $f)"
  grep -E "decode|profiled" $f | grep -v "graph replay" | cut -c1-300
  grep -iE "error|panic" $f | head -3 | cut -c1-200
}

# share_steps BATCHES: decode steps of the real model's one-GPU share (61 V3 layers in AWQ g64,
# 64 routed experts per layer; config only at /tmp/v3x61, dummy weights made at load, about 110 s;
# context 2,048) with $C into $OUT/runR-v3-61.txt, stopping by $SHARE_END seconds after $S
# (default 565); prints the load time, the graph steps and moe_route_align's profile.
share_steps() {
  local f=$OUT/run$R-v3-61.txt
  [ -d /tmp/v3x61 ] || $C gen-checkpoint --config-only --shape v3-layers --layers 61 --routed-experts 64 --dtype awq \
    --out /tmp/v3x61 > /dev/null
  timeout $(( ${SHARE_END:-565} - ($(date +%s) - S) )) $C kernels-check --no-ops --bench-model /tmp/v3x61 --load-format dummy \
    --ctx 2048 --batches $1 --prefill 0 > $f 2>&1
  echo "v3-61 rc=$? $(( $(date +%s) - S )) s: $(grep -o 'loaded in [0-9.]* s' $f)"
  grep -E "CUDA graph" $f | cut -c1-150
  grep -oE "moe_route_align [0-9.]+ms/[0-9]+" $f | head -1
}

# qgemm_tune_run TAG [BIN] [ENV...]: `kernels-check --stages qgemm_tune` with BIN (default $C)
# and ENV set (e.g. CLEAVE_KERNEL_SOURCES=.carry/variants/NAME) into $OUT/runR-TAG.txt (150 s at
# most); prints the verdict and any failing row.
qgemm_tune_run() {
  local f=$OUT/run$R-$1.txt b=$C; shift
  [[ -n $1 && $1 != *=* ]] && { b=$1; shift; }
  env "$@" timeout 150 $b kernels-check --stages qgemm_tune > $f 2>&1
  echo "$1 rc=$? $(( $(date +%s) - S )) s: $(tail -n 1 $f)"
  grep -iE "fail|panic|error" $f | head -5 | cut -c1-200
}

# sass_top REPORT OUT: the 40 SASS instructions with most warp-stall samples in an ncu report
# made with `--section SourceCounters` (file REPORT.ncu-rep), with each one's two largest stall
# reasons, into OUT.
sass_top() {
  ncu -i $1.ncu-rep --page source --csv --print-source sass > /tmp/sass.csv 2>&1
  python3 - /tmp/sass.csv <<'PY' > $2
import csv, sys, re
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"') and 'Source' in l)
rows = list(csv.DictReader(lines[start:]))
cols = list(rows[0].keys())
samp = next(c for c in cols if c.startswith("Warp Stall Sampling (All"))
def f(x):
    try: return float(x.replace(",", ""))
    except: return 0.0
tot = sum(f(r[samp]) for r in rows); print("total samples", tot, "instructions", len(rows))
idx = sorted(range(len(rows)), key=lambda i: -f(rows[i][samp]))[:40]
for i in sorted(idx):
    r = rows[i]
    top = sorted(((f(r[c]), c) for c in cols if c != samp and re.search("stall|Stall", c)), reverse=True)[:2]
    print(f"{i:5} {f(r[samp]) / tot * 100:5.1f}% {r['Source'][:70]:70} {' '.join(f'{c[:28]}={v:.0f}' for v, c in top)}")
PY
}

# awq_models_gen, awq_models_ab: four V3 layers in AWQ (64 experts; v3l4) and V2-Lite in AWQ (v2awq), generated
# into host memory (in the background, unless there already), then their steps with this build and
# $P (v3l4 at batches 1, 16, 64; v2awq at 1, 16, 64, 256) and each run's AWQ GEMMs from the
# profile.
awq_models_gen() {
  ( [ -f /dev/shm/v3l4.done ] || gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64
    [ -f /dev/shm/v2awq.done ] || gen_model v2awq --shape v2-lite --dtype awq ) &
}
awq_models_ab() {
  BENCH_TIMEOUT=50 ab_steps v3l4 1,16,64
  BENCH_TIMEOUT=50 ab_steps v2awq 1,16,64,256
  for m in v3l4 v2awq; do for t in new prev; do
    echo "== $m $t"
    grep -hE "profile decode batch (1|16|64|256):" $OUT/run$R-$m-$t.txt | grep -oE "(batch [0-9]+|kernels [0-9.]+ ms|qg[pw][a-z0-9_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' ' | cut -c1-600; echo
  done; done
}

# tune_experts SHAPES [TAG]: the stream-K expert rows of $OUT/runR-TAG.txt (qgemm_tune; default
# tune-full) for the shapes matching SHAPES (an ERE alternation of shape names as qgemm_tune prints
# them), a line per group, case and shape: time and % of HBM, sorted by case.
tune_experts() {
  grep -E "^qgp awq g[0-9]+ +($1) .* tok, .*stream-K" $OUT/run$R-${2:-tune-full}.txt |
    awk '{l = $3 " " substr($0, 26); sub(/ \(stream-K.*/, "", l); printf "%-76s %-12s %8s us %s\n", l, $4, $(NF-4), $(NF-1)}' |
    sort -s -k1,13 | cut -c1-130
}

# tune_ab NEW PREV: qgemm_tune's best persistent shape per case (its summary lines) in
# $OUT/runR-NEW.txt against $OUT/runR-PREV.txt, one line per case: the times and the ratio.
tune_ab() {
  python3 - $OUT/run$R-$1.txt $OUT/run$R-$2.txt <<'PY'
import re, sys
def best(p):
    out = {}
    for l in open(p):
        m = re.match(r"  ((?:awq|fp8) g\d+ .*?): tiled .*persistent (\S+)(?: stream-K)? ([\d.]+) us \(([\d.]+)% HBM\)", l)
        if m: out[m.group(1)] = (m.group(2), float(m.group(3)), m.group(4))
    return out
new, prev = best(sys.argv[1]), best(sys.argv[2])
for k, (s, t, p) in new.items():
    if k in prev:
        ps, pt, pp = prev[k]
        print(f"{k[:66]:66} {ps:>13} {pt:7.1f} -> {s:>13} {t:7.1f} us {p:>5}% x{pt / t:5.3f}")
PY
}

# tune_ab_run: qgemm_tune with this build ($C, runR-tune-full.txt) and the one before ($P,
# runR-tune-prev.txt), then tune_ab's side-by-side table of the two.
tune_ab_run() {
  qgemm_tune_run tune-full
  qgemm_tune_run tune-prev $P
  echo "== qgemm_tune, best persistent shape per case: before -> this build"
  tune_ab tune-full tune-prev
}

# kernel_ab: a kernel change's run against the build before ($P): the AWQ models generated in the
# background, tune_ab_run, the quick pass, then four V3 layers and V2-Lite in AWQ with both builds.
kernel_ab() {
  awq_models_gen
  tune_ab_run
  quick_checks $R
  wait
  awq_models_ab
}

# share_profile BATCHES: share_steps' kernel profile lines for BATCHES (an ERE alternation such as
# 1|64): the kernel total and the compressed GEMMs' times.
share_profile() {
  grep -E "profile decode batch ($1):" $OUT/run$R-v3-61.txt | grep -oE "(batch [0-9]+|kernels [0-9.]+ ms|qg[a-z0-9_]* [0-9.]+ms/[0-9]+)" | tr '\n' ' ' | cut -c1-600; echo
}
