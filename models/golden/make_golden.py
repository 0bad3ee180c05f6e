#!/usr/bin/env python3
"""Make small random-weight DeepSeek-V3 checkpoints and record what HF transformers computes on them.

Test tooling only: this script is never a dependency of the product. It needs torch, transformers
(5.x), safetensors and tokenizers (the GPU test machines have them; torch runs on CPU here).

    python3 make_golden.py --out DIR [--case NAME --case NAME ...] [--seed S]
    python3 make_golden.py --out DIR --custom NAME --dtype fp8 --hidden 96 --layers 4 --experts 16
        --groups 4 --topk-group 2 --topk 4 --q-lora 0 --block 32 --shards 3 --mtp --seed 7

For each case it writes DIR/<case>/ with config.json, the safetensors weights (canonical HF
DeepSeek-V3 names, per-expert tensors), tokenizer.json, tokenizer_config.json,
generation_config.json, expected.json (HF's greedy continuations) and chat.json (chat-template
renderings). The reference is always computed by HF's DeepseekV3ForCausalLM in float32 on CPU
with eager attention, re-loaded with from_pretrained from what was written (for fp8: from the
blockwise-dequantized weights, see write_case).
"""
import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import traceback

BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
USER = "<\uff5cUser\uff5c>"
ASSISTANT = "<\uff5cAssistant\uff5c>"
THINK = "<think>"
END_THINK = "</think>"

# DeepSeek-R1's chat template, trimmed to the parts our tokenizer has tokens for (no tool calls):
# BOS, all system messages joined by a blank line, <｜User｜> + text, prior assistant turns with
# everything up to the last </think> removed and closed by EOS, and a generation prompt that opens
# the reasoning: <｜Assistant｜><think>\n.
CHAT_TEMPLATE = (
    r"{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    r"{% set ns = namespace(system_prompt='', is_first_sp=true) %}"
    r"{%- for message in messages %}{%- if message['role'] == 'system' %}"
    r"{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}"
    r"{% set ns.is_first_sp = false %}"
    r"{%- else %}{% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}{%- endif %}"
    r"{%- endif %}{%- endfor %}"
    r"{{ bos_token }}{{ ns.system_prompt }}"
    r"{%- for message in messages %}"
    r"{%- if message['role'] == 'user' %}{{'" + USER + r"' + message['content']}}{%- endif %}"
    r"{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    r"{% set content = message['content'] %}"
    r"{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    r"{{'" + ASSISTANT + r"' + content + '" + EOS + r"'}}"
    r"{%- endif %}"
    r"{%- endfor -%}"
    r"{% if add_generation_prompt %}{{'" + ASSISTANT + r"<think>\n'}}{% endif %}"
)

CORPUS = """
The quick brown fox jumps over the lazy dog. A small model can still learn the shape of words.
When the sun rises over the hills, the farmers walk to the fields and the children go to school.
Numbers such as 1, 2, 3, 10, 42 and 2025 appear in text, and so do dates like May 5th.
Reasoning is the process of thinking about something in a logical way to reach a conclusion.
First, we read the question. Then we think step by step. Finally, we write the answer.
Large language models predict the next token given all of the previous tokens in the context.
The attention layer lets every position look at the positions before it and mix their values.
A mixture of experts sends each token to a few experts, chosen by a router with learned weights.
Rotary position embeddings rotate pairs of channels by an angle that grows with the position.
She said that the weather would be fine tomorrow, but he was not sure and took an umbrella.
In the morning there was coffee and bread; in the evening there was soup, rice and vegetables.
What is the capital of France? The capital of France is Paris. What is two plus two? It is four.
Please explain why the sky is blue. The sky looks blue because air scatters blue light the most.
The server reads a request, runs the model, and streams the tokens back to the client one by one.
Good tests compare the output of a new program with the output of a trusted reference program.
If the numbers do not match, look at each layer in turn until the first difference appears.
There are many ways to write a sentence, and there are many sentences that mean the same thing.
The library was quiet, and the only sound was the turning of pages and the ticking of a clock.
They walked along the river, talked about the past, and planned a journey to the mountains.
Water boils at one hundred degrees, and ice melts when the temperature rises above zero.
""".strip().splitlines()


@dataclasses.dataclass
class CaseSpec:
    name: str
    dtype: str = "bf16"  # bf16 | f32 | fp8
    hidden: int = 64
    layers: int = 3
    dense_layers: int = 1  # first_k_dense_replace
    heads: int = 4
    q_lora: int = 48  # 0 = q_lora_rank null (plain q_proj)
    kv_lora: int = 32
    nope: int = 16
    rope: int = 8
    v: int = 16
    inter: int = 128
    moe_inter: int = 32
    experts: int = 8
    groups: int = 4
    topk_group: int = 2
    topk: int = 3
    shared: int = 1
    routed_scaling: float = 2.5
    norm_topk_prob: bool = True
    vocab: int = 400
    rope_style: str = "legacy"  # legacy: rope_scaling {type: yarn}; new: rope_parameters; none: no scaling
    rope_theta: float = 10000.0
    yarn_factor: float = 4.0
    yarn_orig: int = 256
    mscale: float = 1.0
    mscale_all_dim: float = 1.0
    block: int = 32  # fp8 weight_block_size [block, block]
    shards: int = 1
    mtp: bool = False
    seed: int = 1
    prompt_lens: tuple = (11, 1, 70, 140)
    new_tokens: int = 20
    bias_mode: str = "positive"  # positive: 0.4*|N(0,1)|; signed: N(0, 0.5)
    lm_gain: float = 4.0
    router_gain: float = 1.5

    def max_pos(self):
        if self.rope_style == "none":
            return 2048
        return int(round(self.yarn_factor * self.yarn_orig))


CASES = {
    # bf16 weights, q_lora, legacy V3 rope_scaling (yarn factor 4, mscale_all_dim 1),
    # 1 dense + 2 MoE layers, 8 experts in 4 groups, 2 groups kept, 3 experts per token.
    "bf16-qlora": CaseSpec(
        name="bf16-qlora", dtype="bf16", hidden=64, layers=3, dense_layers=1, heads=4, q_lora=48,
        kv_lora=32, nope=16, rope=8, v=16, inter=128, moe_inter=32, experts=8, groups=4, topk_group=2,
        topk=3, shared=1, vocab=400, rope_style="legacy", rope_theta=10000.0, yarn_factor=4.0,
        yarn_orig=256, mscale=1.0, mscale_all_dim=1.0, shards=1, mtp=True, seed=11,
        prompt_lens=(11, 1, 70, 140)),
    # f32 weights, q_lora_rank null, newer `rope_parameters` spelling (rope_theta inside it, yarn
    # factor 8, mscale = mscale_all_dim = 0.707), v_head_dim != qk_nope_head_dim, n_group 1,
    # 2 shared experts, vocab == tokenizer size, sharded into 2 files with an index.
    "f32-noqlora": CaseSpec(
        name="f32-noqlora", dtype="f32", hidden=48, layers=3, dense_layers=1, heads=4, q_lora=0,
        kv_lora=24, nope=16, rope=8, v=24, inter=96, moe_inter=24, experts=6, groups=1, topk_group=1,
        topk=2, shared=2, vocab=384, rope_style="new", rope_theta=50000.0, yarn_factor=8.0,
        yarn_orig=128, mscale=0.707, mscale_all_dim=0.707, shards=2, mtp=False, seed=22,
        prompt_lens=(9, 1, 66, 131)),
    # fp8 e4m3 weights with [32, 32] blocks and dimensions that are not multiples of 32 (partial
    # blocks), no rope scaling at all, 3 heads, 12 experts in 4 groups of 3, MTP layer present.
    "fp8-blocks": CaseSpec(
        name="fp8-blocks", dtype="fp8", hidden=72, layers=3, dense_layers=1, heads=3, q_lora=40,
        kv_lora=40, nope=16, rope=8, v=16, inter=144, moe_inter=40, experts=12, groups=4,
        topk_group=2, topk=4, shared=1, vocab=419, rope_style="none", rope_theta=10000.0, block=32,
        shards=1, mtp=True, seed=33, prompt_lens=(12, 1, 65, 200)),
}


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------------------------
# tokenizer


def build_tokenizer(vocab_target=380):
    """Byte-level BPE. ids 0/1 = BOS/EOS (special); User/Assistant/think tokens appended at the end,
    as in the R1 tokenizer (not special, so they survive skip_special_tokens)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_target,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(BOS, special=True, normalized=False),
                        AddedToken(EOS, special=True, normalized=False)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    n_bpe = tok.get_vocab_size()
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in (USER, ASSISTANT, THINK, END_THINK)])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)])
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1, "BOS/EOS ids"
    return tok, n_bpe


def write_tokenizer(tok, d):
    tok.save(os.path.join(d, "tokenizer.json"))
    cfg = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": 1024,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")


CHAT_EXAMPLES = [
    {"messages": [{"role": "user", "content": "Hello there, how are you?"}], "add_generation_prompt": True},
    {"messages": [{"role": "system", "content": "You are terse."},
                  {"role": "system", "content": "Answer in English."},
                  {"role": "user", "content": "What is two plus two?"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHello!"},
                  {"role": "user", "content": "Tell me a story about the river."}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Why is the sky blue?"}], "add_generation_prompt": False},
]


def write_chat_golden(d, tok):
    """chat.json: template renderings (jinja2 and HF apply_chat_template) and their token ids
    (tokenized without adding special tokens: the rendered text already holds BOS)."""
    import jinja2
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # as HF renders chat templates
    tmpl = env.from_string(CHAT_TEMPLATE)
    hf_tok = None
    try:
        from transformers import AutoTokenizer
        hf_tok = AutoTokenizer.from_pretrained(d)
    except Exception as e:  # noqa: BLE001
        log(f"  [chat] AutoTokenizer failed: {e!r}")
    out = []
    for ex in CHAT_EXAMPLES:
        text = tmpl.render(messages=ex["messages"], add_generation_prompt=ex["add_generation_prompt"],
                           bos_token=BOS, eos_token=EOS)
        ids = tok.encode(text, add_special_tokens=False).ids
        rec = {**ex, "text": text, "ids": ids}
        if hf_tok is not None:
            try:
                hf_text = hf_tok.apply_chat_template(ex["messages"], tokenize=False,
                                                     add_generation_prompt=ex["add_generation_prompt"])
                hf_ids = hf_tok(hf_text, add_special_tokens=False)["input_ids"]
                if hf_text != text or list(hf_ids) != ids:
                    log(f"  [chat] MISMATCH jinja2 vs HF: {text!r} vs {hf_text!r}")
                rec["hf_agrees"] = hf_text == text and list(hf_ids) == ids
            except Exception as e:  # noqa: BLE001
                log(f"  [chat] apply_chat_template failed: {e!r}")
        out.append(rec)
    # plain-text encodings with and without the BOS the post-processor adds
    plain = "The quick brown fox jumps over the lazy dog."
    extra = {"text": plain,
             "ids_add_special": tok.encode(plain, add_special_tokens=True).ids,
             "ids_no_special": tok.encode(plain, add_special_tokens=False).ids}
    with open(os.path.join(d, "chat.json"), "w", encoding="utf-8") as f:
        json.dump({"chat": out, "encode": extra}, f, indent=1, ensure_ascii=False)
        f.write("\n")


# ----------------------------------------------------------------------------------------------
# config


def make_config(spec, tok_size):
    s = spec
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "ep_size": 1,
        "first_k_dense_replace": s.dense_layers,
        "hidden_act": "silu",
        "hidden_size": s.hidden,
        "initializer_range": 0.02,
        "intermediate_size": s.inter,
        "kv_lora_rank": s.kv_lora,
        "max_position_embeddings": s.max_pos(),
        "model_type": "deepseek_v3",
        "moe_intermediate_size": s.moe_inter,
        "moe_layer_freq": 1,
        "n_group": s.groups,
        "n_routed_experts": s.experts,
        "n_shared_experts": s.shared,
        "norm_topk_prob": s.norm_topk_prob,
        "num_attention_heads": s.heads,
        "num_experts_per_tok": s.topk,
        "num_hidden_layers": s.layers,
        "num_key_value_heads": s.heads,
        "num_nextn_predict_layers": 1 if s.mtp else 0,
        "pretraining_tp": 1,
        "q_lora_rank": s.q_lora if s.q_lora else None,
        "qk_nope_head_dim": s.nope,
        "qk_rope_head_dim": s.rope,
        "rms_norm_eps": 1e-06,
        "rope_interleave": True,
        "routed_scaling_factor": s.routed_scaling,
        "scoring_func": "sigmoid",
        "seq_aux": True,
        "tie_word_embeddings": False,
        "topk_group": s.topk_group,
        "topk_method": "noaux_tc",
        "use_cache": True,
        "v_head_dim": s.v,
        "vocab_size": s.vocab,
    }
    yarn = {"beta_fast": 32, "beta_slow": 1, "factor": s.yarn_factor, "mscale": s.mscale,
            "mscale_all_dim": s.mscale_all_dim, "original_max_position_embeddings": s.yarn_orig}
    if s.rope_style == "legacy":  # as in DeepSeek-V3's own config.json
        cfg["rope_theta"] = s.rope_theta
        cfg["rope_scaling"] = {**yarn, "type": "yarn"}
    elif s.rope_style == "new":  # as newer transformers write it: theta inside rope_parameters
        cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": s.rope_theta, **yarn}
    elif s.rope_style == "none":
        cfg["rope_theta"] = s.rope_theta
    else:
        raise ValueError(s.rope_style)
    if s.rope_style == "new":
        cfg["dtype"] = {"bf16": "bfloat16", "f32": "float32", "fp8": "bfloat16"}[s.dtype]
    else:
        cfg["torch_dtype"] = {"bf16": "bfloat16", "f32": "float32", "fp8": "bfloat16"}[s.dtype]
    if s.dtype == "fp8":
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": [s.block, s.block]}
    cfg["transformers_version"] = "4.46.3"
    assert s.vocab >= tok_size, f"vocab {s.vocab} < tokenizer {tok_size}"
    assert cfg["max_position_embeddings"] >= 1024
    return dict(sorted(cfg.items()))


# ----------------------------------------------------------------------------------------------
# weights


def gen_weights(spec):
    """Master weights in f32 (canonical HF names, per-expert), plus MTP dummies (name set)."""
    import torch
    s = spec
    g = torch.Generator().manual_seed(s.seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float32) * std

    def lin(out, inp, gain=1.0):
        return randn(out, inp, std=gain / math.sqrt(inp))

    def norm(n):
        return 1.0 + 0.1 * randn(n)

    def bias(n):
        if s.bias_mode == "positive":
            return 0.4 * randn(n).abs()
        return randn(n, std=0.5)

    W = {}
    H, qk = s.hidden, s.nope + s.rope
    W["model.embed_tokens.weight"] = randn(s.vocab, H)
    for L in range(s.layers):
        p = f"model.layers.{L}."
        W[p + "input_layernorm.weight"] = norm(H)
        a = p + "self_attn."
        if s.q_lora:
            W[a + "q_a_proj.weight"] = lin(s.q_lora, H)
            W[a + "q_a_layernorm.weight"] = norm(s.q_lora)
            W[a + "q_b_proj.weight"] = lin(s.heads * qk, s.q_lora)
        else:
            W[a + "q_proj.weight"] = lin(s.heads * qk, H)
        W[a + "kv_a_proj_with_mqa.weight"] = lin(s.kv_lora + s.rope, H)
        W[a + "kv_a_layernorm.weight"] = norm(s.kv_lora)
        W[a + "kv_b_proj.weight"] = lin(s.heads * (s.nope + s.v), s.kv_lora)
        W[a + "o_proj.weight"] = lin(H, s.heads * s.v)
        W[p + "post_attention_layernorm.weight"] = norm(H)
        m = p + "mlp."
        if L < s.dense_layers:
            W[m + "gate_proj.weight"] = lin(s.inter, H)
            W[m + "up_proj.weight"] = lin(s.inter, H)
            W[m + "down_proj.weight"] = lin(H, s.inter)
        else:
            W[m + "gate.weight"] = lin(s.experts, H, gain=s.router_gain)
            W[m + "gate.e_score_correction_bias"] = bias(s.experts)
            for e in range(s.experts):
                x = f"{m}experts.{e}."
                W[x + "gate_proj.weight"] = lin(s.moe_inter, H)
                W[x + "up_proj.weight"] = lin(s.moe_inter, H)
                W[x + "down_proj.weight"] = lin(H, s.moe_inter)
            si = s.moe_inter * s.shared
            W[m + "shared_experts.gate_proj.weight"] = lin(si, H)
            W[m + "shared_experts.up_proj.weight"] = lin(si, H)
            W[m + "shared_experts.down_proj.weight"] = lin(H, si)
    W["model.norm.weight"] = norm(H)
    W["lm_head.weight"] = lin(s.vocab, H, gain=s.lm_gain)
    mtp = set()
    if s.mtp:  # a few tensors of the MTP module (layer index num_hidden_layers): loaders must skip it
        p = f"model.layers.{s.layers}."
        extra = {
            p + "enorm.weight": norm(H),
            p + "hnorm.weight": norm(H),
            p + "eh_proj.weight": lin(H, 2 * H),
            p + "shared_head.norm.weight": norm(H),
            p + "input_layernorm.weight": norm(H),
            p + "self_attn.kv_a_proj_with_mqa.weight": lin(s.kv_lora + s.rope, H),
            p + "mlp.gate.e_score_correction_bias": bias(s.experts),
            p + "mlp.experts.0.down_proj.weight": lin(H, s.moe_inter),
        }
        W.update(extra)
        mtp = set(extra)
    return W, mtp


def is_fp8_target(name):
    """Linear weights inside layers (not embeddings, norms, lm_head, router gate, bias)."""
    if not name.startswith("model.layers.") or ".mlp.gate." in name:
        return False
    return name.endswith("_proj.weight") or name.endswith("_proj_with_mqa.weight")


def quant_fp8(w, B):
    """Blockwise e4m3 quantization: W ~= q * s, s = amax(block)/448 stored as weight_scale_inv."""
    import torch
    out, inp = w.shape
    nbo, nbi = -(-out // B), -(-inp // B)
    pad = torch.zeros(nbo * B, nbi * B, dtype=torch.float32)
    pad[:out, :inp] = w
    blocks = pad.view(nbo, B, nbi, B)
    scale = (blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0).float()  # [nbo, nbi]
    q = (blocks / scale[:, None, :, None]).reshape(nbo * B, nbi * B)[:out, :inp]
    q = q.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).contiguous()
    full = scale.repeat_interleave(B, 0).repeat_interleave(B, 1)[:out, :inp]
    deq = q.to(torch.float32) * full
    return q, scale.contiguous(), deq


def storage_tensors(spec, W):
    """(tensors to save in the checkpoint, f32 weights exactly as a loader must see them)."""
    import torch
    store, ref = {}, {}
    for n, w in W.items():
        if n.endswith("e_score_correction_bias"):
            store[n] = w.float().contiguous()
            ref[n] = store[n]
        elif spec.dtype == "f32":
            store[n] = w.float().contiguous()
            ref[n] = store[n]
        elif spec.dtype == "bf16" or not is_fp8_target(n):
            store[n] = w.to(torch.bfloat16).contiguous()
            ref[n] = store[n].float()
        else:
            q, sc, deq = quant_fp8(w, spec.block)
            store[n] = q
            store[n[: -len(".weight")] + ".weight_scale_inv"] = sc
            ref[n] = deq
    return store, ref


def save_sharded(d, tensors, shards):
    from safetensors.torch import save_file
    names = list(tensors)
    nbytes = {n: tensors[n].numel() * tensors[n].element_size() for n in names}
    total = sum(nbytes.values())
    if shards <= 1:
        save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    groups, cur, acc = [], [], 0
    per = total / shards
    for n in names:
        cur.append(n)
        acc += nbytes[n]
        if acc >= per * (len(groups) + 1) and len(groups) < shards - 1:
            groups.append(cur)
            cur = []
    groups.append(cur)
    groups = [grp for grp in groups if grp]
    files, wmap = [], {}
    for i, grp in enumerate(groups):
        fn = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n] for n in grp}, os.path.join(d, fn), metadata={"format": "pt"})
        files.append(fn)
        for n in grp:
            wmap[n] = fn
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)
        f.write("\n")
    return files


# ----------------------------------------------------------------------------------------------
# independent float64 reference forward (follows REFERENCE.md section 5; a cross-check of HF)


def rope_params(spec):
    import torch
    s = spec
    dim, base, qk = s.rope, s.rope_theta, s.nope + s.rope
    idx = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    pos_freqs = base ** idx

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if s.rope_style == "none":
        return 1.0 / pos_freqs, 1.0, qk ** -0.5
    factor, orig = s.yarn_factor, s.yarn_orig

    def corr_dim(r):
        return dim * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr_dim(32)), 0)
    high = min(math.ceil(corr_dim(1)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrap = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap
    if s.mscale and s.mscale_all_dim:
        attn_factor = get_mscale(factor, s.mscale) / get_mscale(factor, s.mscale_all_dim)
    else:
        attn_factor = get_mscale(factor)
    scale = qk ** -0.5
    if s.mscale_all_dim:
        scale = scale * get_mscale(factor, s.mscale_all_dim) ** 2
    return inv_freq, attn_factor, scale


def ref_forward(spec, R, ids, stats):
    """float64 forward over the whole sequence; returns logits [T, V]."""
    import torch
    s = spec
    d = torch.float64

    def w(n):
        return R[n].to(d)

    def rms(x, wt):
        return wt * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6))

    def mlp(x, pre):
        return (torch.nn.functional.silu(x @ w(pre + "gate_proj.weight").T) * (x @ w(pre + "up_proj.weight").T)) \
            @ w(pre + "down_proj.weight").T

    T = len(ids)
    inv_freq, attn_factor, scale = rope_params(s)
    ang = torch.arange(T, dtype=d)[:, None] * inv_freq[None, :]
    cos, sin = ang.cos() * attn_factor, ang.sin() * attn_factor

    def rope_il(t):  # t [..., T, rope], interleaved pairs (2i, 2i+1)
        a, b = t[..., 0::2], t[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)

    x = w("model.embed_tokens.weight")[torch.tensor(ids)]
    causal = torch.full((T, T), float("-inf"), dtype=d).triu(1)
    for L in range(s.layers):
        p = f"model.layers.{L}."
        a = p + "self_attn."
        h = rms(x, w(p + "input_layernorm.weight"))
        if s.q_lora:
            q = rms(h @ w(a + "q_a_proj.weight").T, w(a + "q_a_layernorm.weight")) @ w(a + "q_b_proj.weight").T
        else:
            q = h @ w(a + "q_proj.weight").T
        q = q.view(T, s.heads, s.nope + s.rope).transpose(0, 1)  # [nh, T, qk]
        q_nope, q_pe = q.split([s.nope, s.rope], -1)
        ckv = h @ w(a + "kv_a_proj_with_mqa.weight").T
        c, k_pe = ckv.split([s.kv_lora, s.rope], -1)
        kv = (rms(c, w(a + "kv_a_layernorm.weight")) @ w(a + "kv_b_proj.weight").T)
        kv = kv.view(T, s.heads, s.nope + s.v).transpose(0, 1)
        k_nope, vv = kv.split([s.nope, s.v], -1)
        q_pe, k_pe = rope_il(q_pe), rope_il(k_pe[None])
        sc = (q_nope @ k_nope.transpose(-1, -2) + q_pe @ k_pe.transpose(-1, -2)) * scale + causal
        o = (sc.softmax(-1) @ vv).transpose(0, 1).reshape(T, s.heads * s.v)
        x = x + o @ w(a + "o_proj.weight").T
        h = rms(x, w(p + "post_attention_layernorm.weight"))
        m = p + "mlp."
        if L < s.dense_layers:
            x = x + mlp(h, m)
            continue
        sg = torch.sigmoid(h @ w(m + "gate.weight").T)  # [T, E]
        bias = w(m + "gate.e_score_correction_bias")

        def select(scores, fill):
            gs = scores.view(T, s.groups, -1).topk(2, -1).values.sum(-1)
            gidx = gs.topk(s.topk_group, -1).indices
            gmask = torch.zeros(T, s.groups, dtype=d).scatter(1, gidx, 1.0)
            smask = gmask.repeat_interleave(s.experts // s.groups, 1).bool()
            return scores.masked_fill(~smask, fill).topk(s.topk, -1).indices

        # transformers 5.17 masks the dropped groups with -inf (older versions used 0.0, which
        # differs only where sigmoid + bias < 0: never with the default positive bias)
        idx = select(sg + bias, float("-inf"))
        idx_zero = select(sg + bias, 0.0)
        idx_nob = select(sg, float("-inf"))
        for t in range(T):
            a_set = set(idx[t].tolist())
            stats["routings"] += 1
            stats["bias_changes"] += a_set != set(idx_nob[t].tolist())
            stats["fill_differs"] += a_set != set(idx_zero[t].tolist())
        wts = sg.gather(1, idx)
        if s.norm_topk_prob:
            wts = wts / (wts.sum(-1, keepdim=True) + 1e-20)
        wts = wts * s.routed_scaling
        y = torch.zeros_like(h)
        for t in range(T):
            for k in range(s.topk):
                e = int(idx[t, k])
                y[t] += wts[t, k] * mlp(h[t:t + 1], f"{m}experts.{e}.")[0]
        x = x + y + mlp(h, m + "shared_experts.")
    x = rms(x, w("model.norm.weight"))
    return x @ w("lm_head.weight").T


# ----------------------------------------------------------------------------------------------
# HF


def hf_load(d):
    import torch
    from transformers import DeepseekV3ForCausalLM
    attempts = [
        dict(dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"),
        dict(dtype=torch.float32, attn_implementation="eager"),
        dict(torch_dtype=torch.float32, attn_implementation="eager"),
    ]
    last = None
    for kw in attempts:
        try:
            model, info = DeepseekV3ForCausalLM.from_pretrained(d, output_loading_info=True, **kw)
            model.eval()
            return model, info, kw
        except Exception as e:  # noqa: BLE001
            log(f"  from_pretrained({list(kw)}) failed: {e!r}")
            last = e
    raise last


def check_loaded(model, info, R, spec, errs):
    import torch
    mtp_prefix = f"model.layers.{spec.layers}."
    info = {k: list(v) for k, v in (info or {}).items()}
    log("  loading info: " + json.dumps({k: (v if len(v) < 12 else v[:12] + ["..."]) for k, v in info.items()},
                                       default=str))
    missing = info.get("missing_keys", [])
    unexpected = [k for k in info.get("unexpected_keys", []) if not k.startswith(mtp_prefix)]
    mismatched = info.get("mismatched_keys", [])
    errm = info.get("error_msgs", [])
    for label, v in (("missing", missing), ("unexpected (non-MTP)", unexpected),
                     ("mismatched", mismatched), ("error_msgs", errm)):
        if v:
            errs.append(f"{spec.name}: {label} keys on load: {v}")
    sd = model.state_dict()
    used, layouts = set(), set()
    for k, t in sd.items():
        t = t.detach().float()
        if k in R:
            used.add(k)
            if t.shape != R[k].shape or not torch.equal(t, R[k].float()):
                errs.append(f"{spec.name}: loaded {k} differs from written weight")
            continue
        fused = None
        for suffix, parts in (("mlp.experts.gate_up_proj", ("gate_proj", "up_proj")),
                              ("mlp.experts.down_proj", ("down_proj",))):
            if k.endswith(suffix):
                pre = k[: -len(suffix)] + "mlp.experts."
                per = [torch.cat([R[f"{pre}{e}.{pp}.weight"] for pp in parts], 0) for e in range(spec.experts)]
                for e in range(spec.experts):
                    used.update(f"{pre}{e}.{pp}.weight" for pp in parts)
                fused = torch.stack(per, 0)
                if t.shape == fused.shape and torch.equal(t, fused):
                    layouts.add(f"{suffix}: {tuple(t.shape)} = stack_e(cat({'+'.join(parts)}) [out,in])")
                elif t.shape == fused.transpose(1, 2).shape and torch.equal(t, fused.transpose(1, 2)):
                    layouts.add(f"{suffix}: {tuple(t.shape)} = stack_e(cat({'+'.join(parts)}))^T [in,out]")
                else:
                    errs.append(f"{spec.name}: fused {k} {tuple(t.shape)} does not match the per-expert weights")
        if fused is None:
            errs.append(f"{spec.name}: loaded tensor {k} {tuple(t.shape)} has no written counterpart")
    left = [n for n in R if n not in used and not n.startswith(mtp_prefix)]
    if left:
        errs.append(f"{spec.name}: written tensors not found in the model: {left[:8]}")
    for lay in sorted(layouts):
        log(f"  expert storage in memory: {lay}")
    return layouts


def greedy(model, prompt, n):
    import torch
    ids = list(prompt)
    toks, lps, margins, step_logits = [], [], [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
            lp = torch.log_softmax(logits, -1)
            top = torch.topk(logits, 2)
            t = int(top.indices[0])
            toks.append(t)
            lps.append(float(lp[t]))
            margins.append(float(top.values[0] - top.values[1]))
            step_logits.append(logits.clone())
            ids.append(t)
    return toks, lps, margins, step_logits


def f9(x):
    return float(f"{x:.9g}")


def run_case(spec, out_root, tok, n_bpe, errs, notes):
    import torch
    s = spec
    d = os.path.join(out_root, s.name)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    log(f"=== case {s.name}: {json.dumps(dataclasses.asdict(s))}")
    W, mtp = gen_weights(s)
    store, R = storage_tensors(s, W)
    cfg = make_config(s, tok.get_vocab_size())
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 1, "do_sample": True,
                   "temperature": 0.6, "top_p": 0.95, "transformers_version": "4.46.3"}, f, indent=2)
        f.write("\n")
    files = save_sharded(d, store, s.shards)
    write_tokenizer(tok, d)
    log(f"  wrote {len(store)} tensors in {files}; params {sum(w.numel() for w in W.values())}")

    # HF reference. fp8: HF cannot run fp8 on CPU, so the reference model is loaded from the
    # DEQUANTIZED weights (W = q * s blockwise, in f32) with the same config minus
    # quantization_config. The checkpoint written above keeps the fp8 tensors + weight_scale_inv.
    tmp = None
    if s.dtype == "fp8":
        from safetensors.torch import save_file
        tmp = tempfile.mkdtemp(prefix=f"golden-{s.name}-deq-")
        cfg2 = {k: v for k, v in cfg.items() if k != "quantization_config"}
        cfg2["torch_dtype"] = "float32"
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg2, f, indent=2)
        save_file({n: t.contiguous() for n, t in R.items()}, os.path.join(tmp, "model.safetensors"),
                  metadata={"format": "pt"})
        load_dir = tmp
    else:
        load_dir = d
    model, info, kw = hf_load(load_dir)
    log(f"  loaded with {list(kw)}; attn={getattr(model.config, '_attn_implementation', None)} "
        f"experts={getattr(model.config, '_experts_implementation', None)}")
    check_loaded(model, info, R, s, errs)
    for n, p in model.named_parameters():
        if p.dtype != torch.float32:
            errs.append(f"{s.name}: parameter {n} is {p.dtype}, not float32")
            break

    # rope / scaling as HF has them vs our reading of the config
    inv_ref, af_ref, scale_ref = rope_params(s)
    rot = model.model.rotary_emb
    inv_hf = rot.inv_freq.double()
    af_hf = float(getattr(rot, "attention_scaling", float("nan")))
    scale_hf = float(model.model.layers[0].self_attn.scaling)
    log(f"  rope: HF inv_freq {inv_hf.tolist()} attention_scaling {af_hf} softmax scale {scale_hf}")
    log(f"  rope: ours inv_freq {inv_ref.tolist()} attention_factor {af_ref} softmax scale {scale_ref}")
    if inv_hf.shape != inv_ref.shape or (inv_hf - inv_ref).abs().max() > 1e-6 * inv_ref.abs().max():
        errs.append(f"{s.name}: HF inv_freq differs from the YaRN formula of REFERENCE.md")
    if abs(af_hf - af_ref) > 1e-6 or abs(scale_hf - scale_ref) > 1e-6 * scale_ref:
        errs.append(f"{s.name}: HF attention_scaling/softmax scale differ: {af_hf} {scale_hf} vs {af_ref} {scale_ref}")
    notes.setdefault("rope", {})[s.name] = {"inv_freq": inv_hf.tolist(), "attention_scaling": af_hf,
                                           "softmax_scale": scale_hf}

    # prompts: random ids among the plain BPE tokens (not 0/1, not the chat tokens). For each
    # length try a few random prompts and keep the one whose greedy run has the longest prefix of
    # clear (margin >= thr) steps, with no BOS/EOS generated.
    thr = {"f32": 0.05, "bf16": 0.15, "fp8": 0.3}[s.dtype]
    prompts_out, first_logits = [], None
    stats = {"routings": 0, "bias_changes": 0, "fill_differs": 0}
    max_ref_diff, ref_argmax_bad = 0.0, 0
    for slot, plen in enumerate(s.prompt_lens):
        best = None
        for attempt in range(16):
            g = torch.Generator().manual_seed(s.seed * 100003 + slot * 1009 + attempt)
            prompt = torch.randint(2, n_bpe, (plen,), generator=g).tolist()
            toks, lps, margins, step_logits = greedy(model, prompt, s.new_tokens)
            if 0 in toks or 1 in toks:
                continue
            clear = 0
            while clear < len(margins) and margins[clear] >= thr:
                clear += 1
            key = (clear, min(margins[:clear]) if clear else 0.0)
            if best is None or key > best[0]:
                best = (key, prompt, toks, lps, margins, step_logits)
            if clear == s.new_tokens and key[1] >= 2 * thr:
                break
        if best is None:
            errs.append(f"{s.name}: no prompt of length {plen} avoided BOS/EOS")
            continue
        key, prompt, toks, lps, margins, step_logits = best
        if first_logits is None:
            first_logits = step_logits[0]
        # cross-check with the independent float64 reference on the whole sequence
        seq = prompt + toks[:-1]
        ref = ref_forward(s, R, seq, stats)[len(prompt) - 1:]
        hf = torch.stack(step_logits).double()
        diff = float((ref - hf).abs().max())
        max_ref_diff = max(max_ref_diff, diff)
        ref_argmax_bad += int((ref.argmax(-1) != torch.tensor(toks)).sum())
        log(f"  prompt {slot}: len {plen} attempt-best clear-steps {key[0]}/{s.new_tokens} "
            f"min margin {min(margins):.4f} mean logprob {sum(lps) / len(lps):.3f} "
            f"f64-ref max|diff| {diff:.2e} tokens {toks}")
        prompts_out.append({"prompt_ids": prompt, "token_ids": toks,
                            "logprobs": [f9(x) for x in lps], "margins": [f9(x) for x in margins]})
    log(f"  f64 reference vs HF f32: max |logit diff| {max_ref_diff:.3e}, argmax disagreements {ref_argmax_bad}")
    log(f"  routing: {stats['routings']} token-layer routings, bias changed the expert set in "
        f"{stats['bias_changes']}, -inf-fill vs 0.0-fill differ in {stats['fill_differs']}")
    if ref_argmax_bad or max_ref_diff > 1e-3:
        errs.append(f"{s.name}: independent f64 reference disagrees with HF (max diff {max_ref_diff:.3e}, "
                    f"{ref_argmax_bad} argmax disagreements)")
    notes.setdefault("cross_check", {})[s.name] = {"max_abs_logit_diff_f64_vs_hf": max_ref_diff,
                                                  "argmax_disagreements": ref_argmax_bad, **stats}
    import transformers
    expected = {
        "case": s.name,
        "dtype": s.dtype,
        "max_new_tokens": s.new_tokens,
        "prompts": prompts_out,
        "first_logits": [f9(x) for x in first_logits.tolist()] if first_logits is not None else [],
        "reference": {"transformers": transformers.__version__, "torch": torch.__version__,
                      "compute": "HF DeepseekV3ForCausalLM, float32, CPU, eager attention, "
                                 "full recompute per step (no KV cache), greedy argmax, no EOS stop",
                      "weights": "dequantized fp8 (q * weight_scale_inv, blockwise) in f32"
                      if s.dtype == "fp8" else f"{s.dtype} checkpoint upcast to f32"},
    }
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expected, f, separators=(",", ":"))
        f.write("\n")
    try:
        write_chat_golden(d, tok)
    except Exception as e:  # noqa: BLE001
        log(f"  [chat] failed: {e!r}")
    if s.dtype == "fp8":
        try_hf_fp8_loader(d, R, prompts_out, first_logits)
    if notes.get("want_state_dict") is None and s.dense_layers < s.layers:
        notes["want_state_dict"] = [f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in model.state_dict().items()
                                    if k.startswith(f"model.layers.{s.dense_layers}.")]
    del model
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    log(f"  case dir {d}: {size} bytes: {sorted(os.listdir(d))}")


def try_hf_fp8_loader(d, R, prompts_out, first_logits):
    """Informational: does HF's own fine-grained fp8 loader accept the layout (dequantize=True)?"""
    import torch
    try:
        from transformers import DeepseekV3ForCausalLM, FineGrainedFP8Config
        m = DeepseekV3ForCausalLM.from_pretrained(
            d, quantization_config=FineGrainedFP8Config(dequantize=True), dtype=torch.float32,
            attn_implementation="eager")
        sd = m.state_dict()
        k = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
        if k in sd:
            log(f"  [hf-fp8] dequantize=True loaded; {k} dtype {sd[k].dtype}, "
                f"max|diff| vs our dequant {float((sd[k].float() - R[k]).abs().max()):.3e}")
        with torch.no_grad():
            lg = m(input_ids=torch.tensor([prompts_out[0]["prompt_ids"]])).logits[0, -1].float()
        log(f"  [hf-fp8] logits max|diff| vs reference first_logits {float((lg - first_logits).abs().max()):.3e}")
    except Exception as e:  # noqa: BLE001
        log(f"  [hf-fp8] HF fp8 loader not usable here: {e!r}")


def dump_hf_notes(path, src_dir, notes):
    """Version info, the HF source parts whose numerics the engine must match, and copies of the
    source files (into src_dir)."""
    import inspect
    import torch
    import transformers
    from transformers.models.deepseek_v3 import configuration_deepseek_v3 as C
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as M
    import transformers.modeling_rope_utils as RU
    out = [f"transformers {transformers.__version__}", f"torch {torch.__version__}", f"modeling file {M.__file__}", ""]

    def src(mod, name):
        obj = getattr(mod, name, None)
        if obj is None:
            return f"### {mod.__name__}.{name}: NOT FOUND\n"
        try:
            return f"### {mod.__name__}.{name}\n{inspect.getsource(obj)}\n"
        except Exception as e:  # noqa: BLE001
            return f"### {mod.__name__}.{name}: {e!r}\n"

    for n in ("DeepseekV3RMSNorm", "DeepseekV3RotaryEmbedding", "DeepseekV3MLP", "DeepseekV3TopkRouter",
              "DeepseekV3Experts", "DeepseekV3MoE", "yarn_apply_mscale", "rotate_half", "apply_rotary_pos_emb",
              "apply_rotary_pos_emb_interleave", "yarn_get_mscale", "eager_attention_forward",
              "DeepseekV3Attention", "DeepseekV3DecoderLayer", "DeepseekV3PreTrainedModel", "DeepseekV3Model",
              "DeepseekV3ForCausalLM"):
        out.append(src(M, n))
    for n in ("_compute_yarn_parameters", "_compute_default_rope_parameters"):
        out.append(src(RU, n))
    out.append(src(C, "DeepseekV3Config"))
    files = [M.__file__, RU.__file__, C.__file__]
    try:
        import transformers.conversion_mapping as CM
        files.append(CM.__file__)
        lines = open(CM.__file__).read().splitlines()
        out.append("### conversion_mapping.py lines mentioning qwen2_moe / deepseek_v3 (+-14)")
        shown = set()
        for i, line in enumerate(lines):
            if "qwen2_moe" in line or "deepseek_v3" in line:
                for j in range(max(0, i - 14), min(len(lines), i + 15)):
                    if j not in shown:
                        shown.add(j)
                        out.append(f"{j + 1}: {lines[j]}")
                out.append("...")
    except Exception as e:  # noqa: BLE001
        out.append(f"conversion_mapping: {e!r}")
    try:
        import transformers.integrations.moe as MOE
        files.append(MOE.__file__)
        out.append(src(MOE, "use_experts_implementation"))
    except Exception as e:  # noqa: BLE001
        out.append(f"integrations.moe: {e!r}")
    if notes.get("want_state_dict"):
        out.append("### state_dict of the first MoE layer as held in memory (bf16-qlora or first MoE case)")
        out.extend(notes["want_state_dict"])
    out.append("")
    out.append("### rope and cross-check results per case")
    out.append(json.dumps({k: v for k, v in notes.items() if k != "want_state_dict"}, indent=1))
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    if src_dir:
        os.makedirs(src_dir, exist_ok=True)
        for fn in files:
            shutil.copy(fn, os.path.join(src_dir, os.path.basename(fn)))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output root; cases go to OUT/<case>/")
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="predefined case(s); default all")
    ap.add_argument("--seed", type=int, default=None, help="override the weight/prompt seed of every case")
    ap.add_argument("--notes", default=None, help="write HF version + source excerpts to this file")
    ap.add_argument("--hf-src", default=None, help="copy the relevant HF source files into this folder")
    c = ap.add_argument_group("extra case from shape options (--custom NAME)")
    c.add_argument("--custom", default=None, metavar="NAME")
    base = CaseSpec(name="custom")
    for fld, typ, hlp in (("dtype", str, "bf16|f32|fp8"), ("hidden", int, ""), ("layers", int, ""),
                          ("dense_layers", int, "first_k_dense_replace"), ("heads", int, ""),
                          ("q_lora", int, "0 = q_lora_rank null"), ("kv_lora", int, ""), ("nope", int, ""),
                          ("rope", int, ""), ("v", int, ""), ("inter", int, ""), ("moe_inter", int, ""),
                          ("experts", int, ""), ("groups", int, "n_group"), ("topk_group", int, ""),
                          ("topk", int, "num_experts_per_tok"), ("shared", int, "n_shared_experts"),
                          ("routed_scaling", float, ""), ("vocab", int, ""),
                          ("rope_style", str, "legacy|new|none"), ("rope_theta", float, ""),
                          ("yarn_factor", float, ""), ("yarn_orig", int, ""), ("mscale", float, ""),
                          ("mscale_all_dim", float, ""), ("block", int, "fp8 block size"),
                          ("shards", int, "number of safetensors files"), ("new_tokens", int, ""),
                          ("bias_mode", str, "positive|signed")):
        c.add_argument("--" + fld.replace("_", "-"), dest="c_" + fld, type=typ, default=getattr(base, fld),
                       help=f"{hlp} (default {getattr(base, fld)})".strip())
    c.add_argument("--mtp", dest="c_mtp", action="store_true", help="add MTP-layer tensors to skip")
    c.add_argument("--no-norm-topk-prob", dest="c_norm_topk_prob", action="store_false")
    c.add_argument("--prompt-lens", dest="c_prompt_lens", default="11,1,70,140")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import torch
    torch.manual_seed(0)
    specs = []
    if args.custom:
        kw = {k[2:]: v for k, v in vars(args).items() if k.startswith("c_")}
        kw["prompt_lens"] = tuple(int(x) for x in kw["prompt_lens"].split(","))
        specs.append(CaseSpec(name=args.custom, **kw))
    if args.case or not args.custom:
        specs += [dataclasses.replace(CASES[n]) for n in (args.case or CASES)]
    for s in specs:
        if args.seed is not None:
            s.seed = args.seed
        assert s.dtype in ("bf16", "f32", "fp8"), s.dtype
        assert s.experts % s.groups == 0 and s.experts // s.groups >= 2, "need >= 2 experts per group"
        assert s.topk_group <= s.groups and s.topk <= s.topk_group * (s.experts // s.groups)
        assert 0 <= s.dense_layers <= s.layers and s.rope % 2 == 0
    os.makedirs(args.out, exist_ok=True)
    tok, n_bpe = build_tokenizer()
    log(f"tokenizer: {tok.get_vocab_size()} tokens ({n_bpe} BPE incl. BOS/EOS, then User/Assistant/think/"
        f"/think = {[tok.token_to_id(t) for t in (USER, ASSISTANT, THINK, END_THINK)]})")
    errs, notes = [], {}
    for s in specs:
        try:
            run_case(s, args.out, tok, n_bpe, errs, notes)
        except Exception:  # noqa: BLE001
            tb = traceback.format_exc()
            log(tb)
            errs.append(f"{s.name}: exception: {tb.splitlines()[-1]}")
    if args.notes:
        try:
            dump_hf_notes(args.notes, args.hf_src, notes)
        except Exception:  # noqa: BLE001
            log(traceback.format_exc())
            errs.append("hf notes failed")
    if errs:
        log("ERRORS:")
        for e in errs:
            log("  " + e)
        return 1
    log("all cases OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
