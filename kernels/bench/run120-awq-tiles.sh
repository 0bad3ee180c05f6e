#!/bin/bash
# run 120 (nvidia-h100-x4, one GPU then four): AWQ experts on the persistent decode tiles (stream-K)
# from 32 rows per expert up to the bf16 expansion, in place of the 64-row int4 tiles; $P is the
# build before (bf29777).
#   the quick pass (golden fixtures at prefill sizes, tiny-r1-awq graphs vs eager);
#   four V3 layers in AWQ, 64 experts: decode batch 128 and 256 (32 rows per expert at 256) and a
#   512-token prefill (64 rows per expert), before and after;
#   TP4+EP over the 61-layer 64-expert model (each rank 16 experts): decode batch 64 and 256,
#   after (run 119 measured before on 4 x H200).
# `timeout 570 bash kernels/bench/run120-awq-tiles.sh [RUN]`
source kernels/bench/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=$(date +%s); R=${1:-120}
nvidia-smi -L | head -4
gen_model v3l4 --shape v3-layers --dtype awq --routed-experts 64 &
quick_checks $R
for b in prev new; do
  bin=$C; [ $b = prev ] && bin=$P
  BENCH_TIMEOUT=100 bench_steps v3l4-$b $bin v3l4 128,256
  grep -E "profile decode batch 256" $OUT/run$R-v3l4-$b.txt | cut -c1-260
  while [ ! -f /dev/shm/v3l4.done ]; do sleep 1; done
  timeout 100 $bin kernels-check --no-ops --bench-model /dev/shm/v3l4 --batches 1 --prefill 512 > $OUT/run$R-v3l4-pf-$b.txt 2>&1
  echo "prefill 512 $b rc=$?: $(grep -A1 'prefill of one' $OUT/run$R-v3l4-pf-$b.txt | tail -1 | tr -s ' ' | cut -c1-120)"
  grep -E "profile prefill" $OUT/run$R-v3l4-pf-$b.txt | cut -c1-260
done
GROUP_TIMEOUT=200 group_steps "" 64,256
