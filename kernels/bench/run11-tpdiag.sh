#!/bin/bash
# run 11 (one GPU): where CUDA tensor parallelism departs on golden bf16-qlora (the layouts at
# 1, 2 and 3 layers and without yarn, each against one rank and the CPU), then the peak host
# memory of loading the V2-Lite shape on CPU ranks (one rank against a TP2 group of two threads).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
export CLEAVE_KERNEL_CACHE=/tmp/cleave-kernels
C=.carry/cleave
chmod +x $C
[ -z "$NORSS" ] && ({ time $C gen-checkpoint --shape v2-lite --dtype bf16 --out /tmp/v2lite; } > $OUT/gen.txt 2>&1) &
GP=$!
G=models/golden/bf16-qlora
for v in l1 l2 noyarn full; do
  d=/tmp/var-$v; mkdir -p $d; cp $G/*.safetensors $G/tokenizer* $d/ 2>/dev/null
  case $v in
    l1) sed 's/"num_hidden_layers": *[0-9]*/"num_hidden_layers": 1/' $G/config.json > $d/config.json ;;
    l2) sed 's/"num_hidden_layers": *[0-9]*/"num_hidden_layers": 2/' $G/config.json > $d/config.json ;;
    noyarn) python3 -c "import json;c=json.load(open('$G/config.json'));c['rope_scaling']=None;json.dump(c,open('$d/config.json','w'))" ;;
    full) cp $G/config.json $d/ ;;
  esac
  echo "== $v"; timeout 120 $C kernels-check --no-ops --parallel-model $d 2>&1 | grep -E "^  |rror" | grep -v NCCL
done
[ -n "$NORSS" ] && exit 0
wait $GP; grep -E "real|wrote" $OUT/gen.txt
# Peak resident memory of a `generate` run: VmHWM, and the largest anonymous (RssAnon) and
# file-backed (RssFile) parts seen while it ran.
peak() {
  "$@" > $OUT/rss-run.txt 2>&1 & local pid=$! a=0 f=0
  while kill -0 $pid 2>/dev/null; do
    read -r ra rf < <(awk '/RssAnon/{a=$2}/RssFile/{f=$2}END{print a+0, f+0}' /proc/$pid/status 2>/dev/null)
    [ "${ra:-0}" -gt $a ] && a=$ra; [ "${rf:-0}" -gt $f ] && f=$rf
    hwm=$(awk '/VmHWM/{print $2}' /proc/$pid/status 2>/dev/null || echo $hwm)
    sleep 0.2
  done
  wait $pid; echo "rc=$? VmHWM $((hwm/1024)) MiB, peak RssAnon $((a/1024)) MiB, peak RssFile $((f/1024)) MiB"
  grep -E "loaded|token_ids" $OUT/rss-run.txt | cut -c1-160 | tail -3
}
du -sh /tmp/v2lite
for tp in 1 2; do
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  S=$(date +%s); echo "== CPU TP$tp"
  peak $C generate --model /tmp/v2lite --prompt-ids 1,2,3,4 --max-tokens 2 --tensor-parallel-size $tp --output json
  echo "$(( $(date +%s) - S )) s"
done
