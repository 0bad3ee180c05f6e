#!/bin/bash
# run 121 (nvidia-h100-x4, one GPU then four): AWQ linears of 129-256 rows on the persistent
# 64-row tiles (AWQ_QGEMM_MAX_ROWS) in place of the bf16 expansion and cuBLAS; $P is the build
# before (run 120's).
#   the quick pass; the qdecode stage (stacked projections past both limits against the CPU);
#   four V3 layers in AWQ, 64 experts: decode batch 256 and a 256-token prefill, before and after;
#   TP4+EP over the 61-layer 64-expert model: decode batch 256 after (run 120: 58.55 ms before).
# `timeout 570 bash kernels/bench/run121-awq-rows.sh [RUN]`
source kernels/bench/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=$(date +%s); R=${1:-121}
nvidia-smi -L | head -4
gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 &
quick_checks $R
timeout 150 $C kernels-check --stages qdecode,quant > $OUT/run$R-qdecode.txt 2>&1
echo "qdecode rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run$R-qdecode.txt)"
grep -iE "over tol|fail|panic" $OUT/run$R-qdecode.txt | head -5 | cut -c1-170
grep -E "linear awq.*(256|300) x" $OUT/run$R-qdecode.txt | cut -c1-170
for b in prev new; do
  bin=$C; [ $b = prev ] && bin=$P
  BENCH_TIMEOUT=100 bench_steps v3l4-$b $bin v3l4 256
  grep -E "profile decode batch 256" $OUT/run$R-v3l4-$b.txt | cut -c1-260
  timeout 100 $bin kernels-check --no-ops --bench-model /dev/shm/v3l4 --batches 1 --prefill 256 > $OUT/run$R-v3l4-pf-$b.txt 2>&1
  echo "prefill 256 $b rc=$?: $(grep -A1 'prefill of one' $OUT/run$R-v3l4-pf-$b.txt | tail -1 | tr -s ' ' | cut -c1-120)"
  grep -E "profile prefill" $OUT/run$R-v3l4-pf-$b.txt | cut -c1-260
done
GROUP_TIMEOUT=200 group_steps "" 256
