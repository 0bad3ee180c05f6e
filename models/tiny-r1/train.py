"""Train tiny-r1 (HF transformers DeepseekV3ForCausalLM) on freshly generated problems; save it in HF layout.

Usage: python3 train.py --out DIR [--minutes 6.5] [--steps N] [--batch 384] [--seed 1234]
Writes DIR/{config.json, generation_config.json, model.safetensors (bf16, canonical DeepSeek-V3
tensor names), tokenizer.json, tokenizer_config.json}. Needs torch, transformers>=5, tokenizers, safetensors.
The LR schedule follows wall-clock progress unless --steps is given.
"""
import argparse
import copy
import json
import math
import os
import shutil
import time

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

import data

HERE = os.path.dirname(os.path.abspath(__file__))
EOS_ID = 1

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 1040,  # 1033 tokens (1024 BPE + 9 tool tokens), padded to a multiple of 16
    "hidden_size": 256,
    "intermediate_size": 768,
    "moe_intermediate_size": 96,
    "num_hidden_layers": 5,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "q_lora_rank": 128,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "n_routed_experts": 16,
    "n_shared_experts": 1,
    "num_experts_per_tok": 4,
    "n_group": 4,
    "topk_group": 2,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "rope_interleave": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "num_nextn_predict_layers": 0,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "use_cache": True,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}
GENERATION_CONFIG = {"bos_token_id": 0, "eos_token_id": 1, "do_sample": True, "temperature": 0.6, "top_p": 0.95}


class Batches(torch.utils.data.IterableDataset):
    """Endless padded batches (ids, loss mask) of fresh problems; worker w uses seed*1000+w."""

    def __init__(self, seed, batch):
        self.seed, self.batch = seed, batch

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        gen = data.train_examples(self.seed * 1000 + (info.id if info else 0))
        tok = Tokenizer.from_file(os.path.join(HERE, "tokenizer.json"))
        while True:
            pairs = [next(gen) for _ in range(self.batch)]
            prompts = tok.encode_batch([p for p, _ in pairs])
            comps = tok.encode_batch([c for _, c in pairs])
            n = max(len(p.ids) + len(c.ids) for p, c in zip(prompts, comps))
            ids = torch.full((self.batch, n), EOS_ID, dtype=torch.long)
            mask = torch.zeros((self.batch, n), dtype=torch.bool)
            for i, (p, c) in enumerate(zip(prompts, comps)):
                ids[i, : len(p.ids) + len(c.ids)] = torch.tensor(p.ids + c.ids)
                mask[i, len(p.ids): len(p.ids) + len(c.ids)] = True  # loss on the assistant part only
            yield ids, mask


def save_checkpoint(model, out):
    """bf16 safetensors with DeepSeek-V3's canonical names (per-expert gate/up/down_proj)."""
    tensors = {}
    for name, t in model.state_dict().items():
        t = t.detach().float().cpu()
        if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H]: gate rows then up rows
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                tensors[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = t[e, :inter]
                tensors[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = t[e, inter:]
        elif name.endswith("mlp.experts.down_proj"):  # [E, H, I]
            for e in range(t.shape[0]):
                tensors[name.replace("down_proj", f"{e}.down_proj.weight")] = t[e]
        else:
            tensors[name] = t
    tensors = {k: (v if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)).contiguous()
               for k, v in sorted(tensors.items())}
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    for fname, obj in (("config.json", CONFIG), ("generation_config.json", GENERATION_CONFIG)):
        with open(os.path.join(out, fname), "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
    for fname in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.abspath(out) != HERE:
            shutil.copy(os.path.join(HERE, fname), out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=6.5)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch", type=int, default=384)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--seed", type=int, default=data.TRAIN_SEED)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--bias-update", type=float, default=5e-4, help="aux-loss-free balancing step (DeepSeek-V3)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    config = DeepseekV3Config(**{k: copy.deepcopy(v) for k, v in CONFIG.items() if k not in ("architectures", "model_type")})
    model = DeepseekV3ForCausalLM(config).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params} ({n_params / 1e6:.2f}M), experts impl {getattr(config, '_experts_implementation', None)}", flush=True)

    routers = [m for m in model.modules() if type(m).__name__ == "DeepseekV3TopkRouter"]
    loads = torch.zeros(len(routers), config.n_routed_experts, device=dev)

    def count_load(i):
        def hook(_mod, _inp, out):
            loads[i] += torch.bincount(out[2].flatten(), minlength=config.n_routed_experts)
        return hook
    for i, r in enumerate(routers):
        r.register_forward_hook(count_load(i))

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if dev == "cuda" else {}))
    loader = torch.utils.data.DataLoader(Batches(args.seed, args.batch), batch_size=None,
                                         num_workers=args.workers, prefetch_factor=4 if args.workers else None,
                                         persistent_workers=bool(args.workers))

    def loss_of(ids, mask):
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            logits = model(input_ids=ids).logits
        tgt, m = ids[:, 1:], mask[:, 1:]
        return F.cross_entropy(logits[:, :-1][m].float(), tgt[m])

    budget, t0, step, ema = args.minutes * 60, time.time(), 0, None
    model.train()
    for ids, mask in loader:
        ids, mask = ids.to(dev, non_blocking=True), mask.to(dev, non_blocking=True)
        if step == 0:
            try:
                loss_of(ids[:2], mask[:2]).backward()
            except Exception as e:  # e.g. no f32 grouped_mm kernel: loop over experts instead
                print("grouped_mm failed, using eager experts:", repr(e)[:300], flush=True)
                model.set_experts_implementation("eager")
            opt.zero_grad(set_to_none=True)
            loads.zero_()
        elapsed = time.time() - t0
        progress = step / args.steps if args.steps else elapsed / budget
        if progress >= 1.0:
            break
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        loss = loss_of(ids, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():  # DeepSeek-V3 aux-loss-free balancing: push the bias towards equal load
            for r, load in zip(routers, loads):
                r.e_score_correction_bias += args.bias_update * torch.sign(load.mean() - load)
            loads.zero_()
        step += 1
        if step % 100 == 0:
            lv = loss.item()
            ema = lv if ema is None else 0.9 * ema + 0.1 * lv
            print(f"step {step} t {elapsed:.0f}s lr {lr:.2e} loss {lv:.4f} ema {ema:.4f}", flush=True)
    print(f"done: {step} steps, {time.time() - t0:.0f}s, final loss {loss.item():.5f}", flush=True)
    for i, r in enumerate(routers):
        print(f"router {i} bias {[round(x, 3) for x in r.e_score_correction_bias.tolist()]}")
    model.eval()
    save_checkpoint(model, args.out)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump({"steps": step, "seconds": round(time.time() - t0), "final_loss": loss.item(), "params": n_params,
                   "args": vars(args)}, f, indent=2)


if __name__ == "__main__":
    main()
