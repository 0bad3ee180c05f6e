#!/usr/bin/env bash
# Retrain tiny-r1 with R1's tool-call tokens and calculator calls (issue 18), then HF's greedy evaluation:
# the 1000 held-out problems and 200 tool cases in left-padded batches (fast), and the fixed problems and
# the first 8 tool cases without padding (exact; cleave's tests compare against them).
# Outputs: $OUT/{model.safetensors,config.json,generation_config.json,train.log,train_log.json,
# eval_report.json,expected_answers.json,tool_cases.json}.
set -u
cd models/tiny-r1
export PYTHONUNBUFFERED=1
W=/tmp/tiny
S=$(date +%s)
python3 train.py --out $W --minutes ${MINUTES:-6} > $OUT/train.log 2>&1; echo "train rc=$? $(( $(date +%s) - S )) s"; tail -3 $OUT/train.log
cp $W/model.safetensors $W/config.json $W/generation_config.json $W/train_log.json $OUT/
python3 eval_hf.py --model $W --padded --out $OUT/eval_report.json > /tmp/eval_padded.txt 2>&1; echo "eval padded rc=$? $(( $(date +%s) - S )) s"
grep -v "^WRONG" /tmp/eval_padded.txt | tail -4; grep -c "^WRONG" /tmp/eval_padded.txt
python3 eval_hf.py --model $W --limit 8 --out /tmp/eval8.json --expected $OUT/expected_answers.json --tool-cases $OUT/tool_cases.json > /tmp/eval8.txt 2>&1; echo "eval exact rc=$? $(( $(date +%s) - S )) s"
tail -25 /tmp/eval8.txt
