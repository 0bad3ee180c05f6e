#!/bin/bash
# run 25b: run 25's checks again with their output kept (run 25 returned too many files).
source kernels/bench/lib.sh
timeout 170 $C kernels-check --quick --stages quant,qdecode --golden models/golden --compare-model models/tiny-r1-awq > /tmp/quick.txt 2>&1
echo "quick rc=$?"; grep -E "over tol|FAIL|failed|rror|panic|DIFF|within tolerance" /tmp/quick.txt | head -8; grep -A14 "^golden" /tmp/quick.txt | head -16
timeout 150 $C kernels-check --stages qgemm_tune > /tmp/tune.txt 2>&1; echo "tune rc=$?"
grep -E "over tol|failed|rror|panic" /tmp/tune.txt | head -5
sed -n '/^qgemm_tune:/,$p' /tmp/tune.txt | grep "  " | cut -c1-200 > $OUT/tune-summary.txt
grep -E "^(qg tiled|qgp) " /tmp/tune.txt | cut -c1-150 > $OUT/tune-rows.txt
grep -E "tok" $OUT/tune-summary.txt
