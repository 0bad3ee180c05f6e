"""PyTorch eager peer for cleave's decode benchmark: transformers' DeepseekV3ForCausalLM at the
DeepSeek-V2-Lite shape (27 layers, hidden 2048, 64 routed + 2 shared experts, 6 active, kv_lora 512,
no q_lora, 16 heads), random bf16 weights on one GPU. Decode tokens/s at each batch size:
(generate(prompt, 1 + N tokens) - generate(prompt, 1 token)) / N steps, greedy, after a warm-up.

usage: python3 torch_peer.py [--batches 1,64] [--prompt 128] [--steps 32]
"""
import argparse
import json
import time

import torch
import transformers
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    a = ap.parse_args()
    cfg = DeepseekV3Config(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, first_k_dense_replace=1, num_attention_heads=16, num_key_value_heads=16,
        n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, n_group=1, topk_group=1,
        routed_scaling_factor=1.0, norm_topk_prob=False, q_lora_rank=None, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, max_position_embeddings=8192,
        rope_interleave=True, bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    t0 = time.time()
    with torch.device("cuda"):
        model = DeepseekV3ForCausalLM(cfg)
    model.eval()
    torch.cuda.synchronize()
    params = sum(p.numel() for p in model.parameters())
    impl = {k: getattr(model.config, k, None) for k in ("_attn_implementation", "_experts_implementation")}
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {params / 1e9:.2f} B params "
          f"built in {time.time() - t0:.1f} s, {impl}", flush=True)
    results = {}
    for b in [int(x) for x in a.batches.split(",")]:
        ids = torch.randint(3, cfg.vocab_size, (b, a.prompt), device="cuda")
        mask = torch.ones_like(ids)

        def gen(n):
            torch.cuda.synchronize()
            t = time.time()
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                     do_sample=False, pad_token_id=2)
            torch.cuda.synchronize()
            assert out.shape[1] == a.prompt + n, out.shape
            return time.time() - t

        gen(2)  # warm-up
        t1 = min(gen(1) for _ in range(2))
        tn = gen(1 + a.steps)
        step = (tn - t1) / a.steps
        results[b] = {"step_ms": step * 1e3, "tok_s": b / step, "prefill_plus_first_ms": t1 * 1e3}
        print(f"batch {b:4d}: decode step {step * 1e3:8.2f} ms, {b / step:9.1f} tokens/s "
              f"(prefill of {a.prompt} + first token {t1 * 1e3:.1f} ms)", flush=True)
    print("TORCH_PEER " + json.dumps(results))


if __name__ == "__main__":
    main()
