#!/bin/bash
# run 77 (one GPU): the session's final binary: the fp8_prefill and experts stages and the quick
# pass with the golden fixtures (FP8 blocks among them) and tiny-r1-awq. Run 78 repeats it on the
# review mends, with the qdecode stage too (`bash kernels/bench/run77-final.sh 78`).
source kernels/bench/lib.sh
S=$(date +%s)
for st in fp8_prefill experts ${1:+qdecode}; do
  timeout 200 $C kernels-check --stages $st > $OUT/run${1:-77}-$st.txt 2>&1
  echo "$st rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${1:-77}-$st.txt)"
done
grep -E "wgmma|fp8" $OUT/run${1:-77}-experts.txt | cut -c1-140 | head -6
timeout 200 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1-awq > $OUT/run${1:-77}-quick.txt 2>&1
echo "quick rc=$? $(( $(date +%s) - S )) s: $(tail -1 $OUT/run${1:-77}-quick.txt)"
grep -iE "over tol|fail|panic|error" $OUT/run${1:-77}-quick.txt | grep -v "see note" | head -5
