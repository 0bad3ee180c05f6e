#!/usr/bin/env bash
# On a machine with torch + transformers (the GPU test machines): make golden cases the tests
# have never seen (other sizes, seeds, dtypes, q_lora on/off, fp8 blocks that do not divide the
# dimensions, AWQ int4 with group 64 / group 32 and modules left unquantized, signed router bias)
# and check `cleave generate` against HF on each (CUDA_CHECK=1: also on the GPU at float32).
#   bash models/golden/verify_unseen.sh CLEAVE_BINARY OUT_DIR
set -euo pipefail
cleave=${1:?cleave binary}; out=${2:?output dir}
here=$(dirname "$0")
g="python3 $here/make_golden.py --out $out"
export CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
$g --custom u-bf16-wide --dtype bf16 --hidden 96 --layers 4 --dense-layers 2 --heads 6 --q-lora 64 --kv-lora 48 --experts 16 --groups 4 --topk-group 2 --topk 4 --shared 1 --seed 101 --bias-mode signed
$g --custom u-f32-noq --dtype f32 --hidden 80 --layers 3 --heads 2 --q-lora 0 --kv-lora 40 --nope 24 --rope 16 --v 32 --experts 12 --groups 3 --topk-group 1 --topk 2 --shared 2 --shards 3 --seed 202
$g --custom u-fp8-b48 --dtype fp8 --block 48 --hidden 100 --layers 3 --heads 5 --q-lora 56 --kv-lora 36 --experts 8 --groups 2 --topk-group 1 --topk 3 --seed 303 --mtp --bias-mode signed
$g --custom u-f16ish-yarn --dtype bf16 --hidden 64 --layers 5 --dense-layers 1 --yarn-factor 8 --yarn-orig 128 --mscale 0.9 --mscale-all-dim 0.9 --seed 404 --prompt-lens 3,70,150
$g --custom u-awq-g64 --dtype awq --awq-group 64 --hidden 192 --layers 3 --heads 4 --q-lora 64 --kv-lora 64 --inter 384 --moe-inter 128 --experts 8 --groups 2 --topk-group 1 --topk 2 --seed 505 --mtp --bias-mode signed
$g --custom u-awq-g32-skip --dtype awq --awq-group 32 --awq-skip self_attn.kv_b_proj --awq-skip shared_experts --hidden 96 --layers 3 --heads 3 --q-lora 0 --kv-lora 32 --v 32 --inter 160 --moe-inter 96 --experts 12 --groups 4 --topk-group 2 --topk 3 --shards 3 --seed 606
python3 "$here/compare_cleave.py" --cleave "$cleave" "$out"/u-*
# With a GPU: the CUDA engine at float32 on the same cases (compressed AWQ / FP8 weights included).
if [ -n "${CUDA_CHECK:-}" ]; then
  CUDA_VISIBLE_DEVICES=0 python3 "$here/compare_cleave.py" --cleave "$cleave" --device cuda --dtype float32 "$out"/u-*
fi
