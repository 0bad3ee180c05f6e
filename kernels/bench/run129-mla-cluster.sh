#!/bin/bash
# run 129 (one GPU): v3 MLA decode merging a row's splits in thread block clusters (up to 8
# blocks, through distributed shared memory) in place of mla_combine where one cluster holds a
# row's splits. The attention stage against the CPU (every variant, timed), the quick pass, bf16
# V2-Lite steps against the build before ($P), and ncu's time of the MLA kernels at 1k x 1/64/256.
# `timeout 570 bash kernels/bench/run129-mla-cluster.sh [RUN]`
source kernels/bench/lib.sh
S=$(date +%s); R=${1:-129}
nvidia-smi --query-gpu=name --format=csv,noheader
gen_model v2lite --shape v2-lite &
for b in new prev; do
  bin=$C; [ $b = prev ] && bin=$P
  timeout 170 $bin kernels-check --stages attention > $OUT/run$R-attn-$b.txt 2>&1
  echo "attention $b rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run$R-attn-$b.txt)"
done
grep -iE "over tol|fail|panic|error" $OUT/run$R-attn-new.txt | head -5 | cut -c1-200
grep -E "^mla_attention" $OUT/run$R-attn-new.txt | grep -E "decode|few|split" | cut -c1-130
echo "--- prev"
grep -E "^mla_attention" $OUT/run$R-attn-prev.txt | grep -E "decode|few|split" | cut -c1-130
quick_checks $R
for b in new prev; do
  bin=$C; [ $b = prev ] && bin=$P
  bench_steps v2lite-$b $bin v2lite 1,4,64,256
done
M=gpu__time_duration.sum,dram__bytes_read.sum
for cb in 1024x1 1024x64; do
  ctx=${cb%x*}; bt=${cb#*x}
  timeout 100 ncu --profile-from-start off --clock-control none --kernel-name regex:mla_ --metrics $M --csv --print-units base \
    $C kernels-check --no-ops --bench-model /dev/shm/v2lite --ctx $ctx --batches $bt --prefill 0 > $OUT/run$R-ncu-$cb.csv 2>&1
  echo "ncu $cb rc=$? $(( $(date +%s) - S )) s"
  python3 kernels/bench/ncu_table.py $OUT/run$R-ncu-$cb.csv "new $cb" 4
done
