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
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import traceback

from golden_config import CASES, CaseSpec, log, make_config, parse_args
from golden_reference import ref_forward, rope_params
from golden_tokenizer import ASSISTANT, END_THINK, THINK, USER, build_tokenizer, write_chat_golden, write_tokenizer
from golden_weights import gen_weights, save_sharded, storage_tensors


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

    # HF reference. fp8 / awq: HF cannot run them on CPU, so the reference model is loaded from the
    # DEQUANTIZED weights (fp8: W = q * s blockwise; awq: W = (q - z) * s per group; in f32) with the
    # same config minus quantization_config. The checkpoint written above keeps the packed tensors.
    tmp = None
    if s.dtype in ("fp8", "awq"):
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
    thr = {"f32": 0.05, "bf16": 0.15, "fp8": 0.3, "awq": 0.3}[s.dtype]
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
                      "weights": {"fp8": "dequantized fp8 (q * weight_scale_inv, blockwise) in f32",
                                  "awq": "dequantized AWQ int4 ((q - z) * s per group) in f32"}.get(
                                      s.dtype, f"{s.dtype} checkpoint upcast to f32")},
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


def main(argv=None):
    args = parse_args(argv, __doc__)
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
        assert s.dtype in ("bf16", "f32", "fp8", "awq"), s.dtype
        s.awq_skip = tuple(s.awq_skip)
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
