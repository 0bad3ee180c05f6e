#!/bin/bash
# run 70 (one GPU): the review mends (one dynamic shared-memory limit, the flash prefill kernels
# named once): the prefill stage (both flash instances against the CPU) and the quick pass.
source kernels/bench/lib.sh
timeout 200 $C kernels-check --stages prefill > $OUT/run70-prefill.txt 2>&1
echo "prefill rc=$?: $(tail -1 $OUT/run70-prefill.txt)"
grep -E "mla_prefill_flash" $OUT/run70-prefill.txt | cut -c1-130 | head -6
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1-awq > $OUT/run70-quick.txt 2>&1
echo "quick rc=$?: $(tail -1 $OUT/run70-quick.txt)"
grep -iE "over tol|fail|panic|error" $OUT/run70-quick.txt | grep -v "see note" | head -5
