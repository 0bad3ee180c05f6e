"""Golden-fixture case specs (CaseSpec, CASES), the config.json they map to (make_config), and
make_golden.py's command line (parse_args). Test tooling only; see make_golden.py."""
import argparse
import dataclasses


def log(*a):
    print(*a, flush=True)


@dataclasses.dataclass
class CaseSpec:
    name: str
    dtype: str = "bf16"  # bf16 | f32 | fp8 | awq
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
    awq_group: int = 128  # awq group_size
    awq_skip: tuple = ()  # awq modules_to_not_convert (kept bf16)
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
    # AutoAWQ int4, group 128, every linear layer in the decoder quantized (attention included),
    # all input sizes multiples of 128; the MTP layer present.
    "awq-g128": CaseSpec(
        name="awq-g128", dtype="awq", hidden=128, layers=3, dense_layers=1, heads=4, q_lora=128,
        kv_lora=128, nope=16, rope=8, v=32, inter=256, moe_inter=128, experts=8, groups=4,
        topk_group=2, topk=3, shared=1, vocab=400, rope_style="legacy", rope_theta=10000.0,
        yarn_factor=4.0, yarn_orig=256, awq_group=128, shards=1, mtp=True, seed=44,
        prompt_lens=(10, 1, 67, 150)),
    # AutoAWQ int4, group 64, attention left in bf16 through modules_to_not_convert, no q_lora,
    # 2 shared experts, sharded into 2 files.
    "awq-g64-attn16": CaseSpec(
        name="awq-g64-attn16", dtype="awq", hidden=64, layers=3, dense_layers=1, heads=4, q_lora=0,
        kv_lora=32, nope=16, rope=8, v=16, inter=192, moe_inter=64, experts=8, groups=2,
        topk_group=1, topk=2, shared=2, vocab=384, rope_style="new", rope_theta=10000.0,
        yarn_factor=8.0, yarn_orig=128, mscale=0.707, mscale_all_dim=0.707, awq_group=64,
        awq_skip=("self_attn",), shards=2, mtp=False, seed=55, prompt_lens=(8, 1, 64, 129)),
}


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
        cfg["dtype"] = {"bf16": "bfloat16", "f32": "float32", "fp8": "bfloat16", "awq": "float16"}[s.dtype]
    else:
        cfg["torch_dtype"] = {"bf16": "bfloat16", "f32": "float32", "fp8": "bfloat16", "awq": "float16"}[s.dtype]
    if s.dtype == "fp8":
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": [s.block, s.block]}
    if s.dtype == "awq":  # as AutoAWQ writes it (DeepSeek-V3-AWQ / R1-AWQ)
        cfg["quantization_config"] = {"bits": 4, "group_size": s.awq_group,
                                      "modules_to_not_convert": list(s.awq_skip) or None,
                                      "quant_method": "awq", "version": "gemm", "zero_point": True}
    cfg["transformers_version"] = "4.46.3"
    assert s.vocab >= tok_size, f"vocab {s.vocab} < tokenizer {tok_size}"
    assert cfg["max_position_embeddings"] >= 1024
    return dict(sorted(cfg.items()))


def parse_args(argv, description=None):
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output root; cases go to OUT/<case>/")
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="predefined case(s); default all")
    ap.add_argument("--seed", type=int, default=None, help="override the weight/prompt seed of every case")
    ap.add_argument("--notes", default=None, help="write HF version + source excerpts to this file")
    ap.add_argument("--hf-src", default=None, help="copy the relevant HF source files into this folder")
    c = ap.add_argument_group("extra case from shape options (--custom NAME)")
    c.add_argument("--custom", default=None, metavar="NAME")
    base = CaseSpec(name="custom")
    for fld, typ, hlp in (("dtype", str, "bf16|f32|fp8|awq"), ("awq_group", int, "awq group_size"), ("hidden", int, ""), ("layers", int, ""),
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
    c.add_argument("--awq-skip", dest="c_awq_skip", action="append", default=[],
                   help="awq: a module name fragment kept bf16 (modules_to_not_convert); repeatable")
    c.add_argument("--no-norm-topk-prob", dest="c_norm_topk_prob", action="store_false")
    c.add_argument("--prompt-lens", dest="c_prompt_lens", default="11,1,70,140")
    return ap.parse_args(argv)
