"""Independent float64 DeepSeek-V3 forward pass written from REFERENCE.md section 5 (rope_params,
ref_forward): make_golden.py cross-checks HF's logits with it. Nothing in the fixtures depends on it."""
import math


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
