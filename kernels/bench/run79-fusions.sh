#!/bin/bash
# run 79 (one GPU): fewer launches per decode layer. moe_route + moe_align in one block up to 64
# tokens, the MoE combine + residual add + next RMSNorm in one kernel, the MLA combine + W_UV
# in one kernel up to 4 rows. Checks (the quick pass with golden fixtures and tiny-r1, the
# engine's fused ops now forwarded by CudaRef; the attention stage at real shapes), then steps
# with the binary before ($CO, HEAD 8fa23a4) and after in the same run: bf16 V2-Lite, AWQ
# V2-Lite and four V3 layers in AWQ (64 routed experts). `bash run79-fusions.sh 80` names run 80's files.
source kernels/bench/lib.sh
CO=.carry/cleave-old; chmod +x $CO
S=$(date +%s); R=${1:-79}
( $C gen-checkpoint --shape v2-lite --out /dev/shm/v2lite > /dev/null 2>&1
  $C gen-checkpoint --shape v2-lite --dtype awq --out /dev/shm/v2awq > /dev/null 2>&1
  $C gen-checkpoint --shape v3-layers --dtype awq --routed-experts 64 --out /dev/shm/v3l4 > /dev/null 2>&1 ) &
GP=$!
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run${R}-checks.txt 2>&1
echo "checks rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-checks.txt)"
grep -iE "fail|panic|graphs vs eager|over tol|few rows|moe layer" $OUT/run${R}-checks.txt | cut -c1-170 | head -30
timeout 120 $C kernels-check --quick --compare-model models/tiny-r1-awq > $OUT/run${R}-checks-awq.txt 2>&1
echo "checks awq rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-checks-awq.txt)"
grep -iE "fail|panic|graphs vs eager|over tol" $OUT/run${R}-checks-awq.txt | cut -c1-170 | head -8
timeout 150 $C kernels-check --stages attention,experts > $OUT/run${R}-stages.txt 2>&1
echo "stages rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${R}-stages.txt)"
grep -E "few rows|moe layer|over tol" $OUT/run${R}-stages.txt | cut -c1-170 | head -30
wait $GP
for bin in old new; do
  B=$C; [ $bin = old ] && B=$CO
  timeout 100 $B kernels-check --no-ops --bench-model /dev/shm/v2lite --batches 1,2,4,64,256 --prefill 0 > $OUT/run${R}-v2lite-$bin.txt 2>&1
  echo "v2lite $bin rc=$? $(( $(date +%s) - S )) s"
  timeout 100 $B kernels-check --no-ops --bench-model /dev/shm/v2awq --batches 1,16,64 --prefill 0 > $OUT/run${R}-v2awq-$bin.txt 2>&1
  echo "v2awq $bin rc=$? $(( $(date +%s) - S )) s"
  timeout 100 $B kernels-check --no-ops --bench-model /dev/shm/v3l4 --ctx 2048 --batches 1,8,64 --prefill 0 > $OUT/run${R}-v3l4-$bin.txt 2>&1
  echo "v3l4 $bin rc=$? $(( $(date +%s) - S )) s"
done
grep -E "profile decode" $OUT/run${R}-v2lite-new.txt | head -3 | cut -c1-300
rm -rf /dev/shm/v2lite /dev/shm/v2awq /dev/shm/v3l4
echo "== summary"
for f in $OUT/run${R}-v2lite-*.txt $OUT/run${R}-v2awq-*.txt $OUT/run${R}-v3l4-*.txt; do echo "$(basename $f)"; grep "CUDA graph" $f | cut -c1-72; done
