#!/usr/bin/env bash
# Mixed scenario (cleave-bench mixed), colocated vs 1P1D, on CPU, with charts.
# Run from the repository root after `cargo build --release -p cleave -p cleave-bench`:
#   bash loadtests/scripts/mixed_cpu.sh OUTDIR
set -euo pipefail
out=$1; mkdir -p "$out"
for cfg in cpu-colocated cpu-tiny; do
  ./target/release/cleave serve --config configs/$cfg.yaml --port 0 > "$out/$cfg.serve.log" 2>&1 &
  pid=$!
  for i in $(seq 1 100); do grep -q "ready at" "$out/$cfg.serve.log" && break; sleep 0.2; done
  url=$(grep -o "http://[0-9.:]*" "$out/$cfg.serve.log" | head -1)
  ./target/release/cleave-bench mixed --base-url "$url" --background-concurrency 4 --background-input-len 32 \
    --background-output-len 512 --long-input-len 1536 --long-output-len 16 --long-interval 3 --num-long 5 \
    --warmup 2 --label "$cfg" --save-result "$out/$cfg.json" --disable-tqdm 2>&1 | tee "$out/$cfg.report.txt" | tail -25 || true
  kill $pid; wait $pid 2>/dev/null || true
done
./target/release/cleave-bench chart --input "$out/cpu-colocated.json" --input "$out/cpu-tiny.json" --label colocated --label 1p1d --output "$out/mixed"
