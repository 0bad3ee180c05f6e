#!/bin/bash
# run 43 (one GPU): the review's change (graphs' workspace freed on failure or drop) checked end to
# end: the quick pass, golden fixtures and tiny-r1 with graphs vs eager, a served tiny-r1.
source kernels/bench/lib.sh
timeout 250 $C kernels-check --quick --golden models/golden --compare-model models/tiny-r1 > $OUT/run43-checks.txt 2>&1
echo "checks rc=$? $(tail -1 $OUT/run43-checks.txt)"; grep -ciE "graphs vs eager.*ok" $OUT/run43-checks.txt
grep -iE "fail|panic" $OUT/run43-checks.txt | head -5
start_server $OUT/run43-serve.txt models/tiny-r1 --device cuda --port 8123
curl -s localhost:8123/v1/completions -H 'content-type: application/json' -d '{"model":"tiny-r1","prompt":"12+7=","max_tokens":16,"temperature":0}' | head -c 200; echo
kill $SP; wait $SP 2>/dev/null
grep -hE "captured|cuda rank loaded|WARN|ERROR" $OUT/run43-serve.txt | cut -c1-200
