"""Golden-fixture weights: seeded f32 master weights, their bf16 / f32 / fp8 (e4m3, blockwise
scales) storage, and the safetensors checkpoint (optionally sharded). Test tooling only."""
import json
import math
import os


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


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a packed int32 holds column 8 * word + AWQ_ORDER[i]


def pack_awq(v):
    """[rows, cols] integers in 0..15 -> AutoAWQ "gemm" int32 words [rows, cols / 8]."""
    import torch
    rows, cols = v.shape
    v = v.to(torch.int64).view(rows, cols // 8, 8)
    word = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for i, o in enumerate(AWQ_ORDER):
        word |= v[:, :, o] << (4 * i)
    word = torch.where(word >= 2 ** 31, word - 2 ** 32, word)  # as int32 bit patterns
    return word.to(torch.int32).contiguous()


def quant_awq(w, G):
    """AutoAWQ-style asymmetric int4 per group of G input channels: s = (max - min) / 15 (stored
    f16), z = round(-min / s), q = clamp(round(w / s) + z, 0, 15); W ~= (q - z) * s. Returns the
    checkpoint tensors (qweight [in, out/8], qzeros [in/G, out/8], scales f16 [in/G, out]) and
    the dequantized f32 weight [out, in] a loader must see."""
    import torch
    out, inp = w.shape
    assert inp % G == 0 and out % 8 == 0, (w.shape, G)
    g = w.view(out, inp // G, G)
    mx, mn = g.amax(-1), g.amin(-1)
    scale = ((mx - mn).clamp(min=1e-5) / 15.0).to(torch.float16)  # [out, in/G]
    s32 = scale.float()
    zero = torch.round(-mn / s32).clamp(0, 15)
    q = (torch.round(g / s32[..., None]) + zero[..., None]).clamp(0, 15)
    deq = ((q - zero[..., None]) * s32[..., None]).view(out, inp)
    qweight = pack_awq(q.view(out, inp).t().contiguous())
    qzeros = pack_awq(zero.t().contiguous())
    return qweight, qzeros, scale.t().contiguous(), deq


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
        elif spec.dtype == "awq" and is_fp8_target(n) and not any(m in n for m in spec.awq_skip):
            qw, qz, sc, deq = quant_awq(w, spec.awq_group)
            base = n[: -len(".weight")]
            store[base + ".qweight"], store[base + ".qzeros"], store[base + ".scales"] = qw, qz, sc
            ref[n] = deq
        elif spec.dtype in ("bf16", "awq") or not is_fp8_target(n):
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
