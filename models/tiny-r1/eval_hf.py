"""HF greedy evaluation of tiny-r1 on the 1000 held-out problems (and the fixed problems for cleave's test).

Usage: python3 eval_hf.py [--model DIR] [--out report.json] [--expected expected_answers.json]
The bf16 checkpoint is loaded in float32 (what cleave's CPU backend computes). Prompts are batched only
with prompts of the same token length, so no padding is involved (--padded: left-pad, faster, approximate).
"""
import argparse
import json
import os
import time
from collections import defaultdict

import torch
from transformers import AutoTokenizer, DeepseekV3ForCausalLM

import data

HERE = os.path.dirname(os.path.abspath(__file__))
EOS_ID = 1


def prompt_ids(tok, user, tools=None):
    """HF's rendering of a user message or a list of messages, with the tools, checked against data.py."""
    messages = [{"role": "user", "content": user}] if isinstance(user, str) else user
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text == data.render_prompt(messages, tools=tools), (text, data.render_prompt(messages, tools=tools))
    return tok(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def greedy(model, prompts, max_new, batch, padded):
    """Greedy outputs (token ids up to and including EOS) for each prompt."""
    dev = next(model.parameters()).device
    groups = defaultdict(list)
    for i, p in enumerate(prompts):
        groups[0 if padded else len(p)].append(i)
    outs = [None] * len(prompts)
    for idx in groups.values():
        for s in range(0, len(idx), batch):
            chunk = idx[s: s + batch]
            n = max(len(prompts[i]) for i in chunk)
            ids = torch.tensor([[EOS_ID] * (n - len(prompts[i])) + prompts[i] for i in chunk], device=dev)
            mask = torch.tensor([[0] * (n - len(prompts[i])) + [1] * len(prompts[i]) for i in chunk], device=dev)
            gen = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                                 eos_token_id=EOS_ID, pad_token_id=EOS_ID)[:, n:].tolist()
            for i, g in zip(chunk, gen):
                outs[i] = g[: g.index(EOS_ID) + 1] if EOS_ID in g else g
    return outs


def run(model, tok, users, args, tools=None):
    prompts = [prompt_ids(tok, u, t) for u, t in zip(users, tools or [None] * len(users))]
    outs = greedy(model, prompts, args.max_new, args.batch, args.padded)
    return prompts, outs, [tok.decode(o, skip_special_tokens=False) for o in outs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=HERE)
    ap.add_argument("--out", default="eval_report.json")
    ap.add_argument("--expected", default=None, help="also write the fixed problems' outputs to this file")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--max-new", type=int, default=400)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--padded", action="store_true")
    ap.add_argument("--tool-cases", default=None, help="write the first 8 tool-call cases (prompts, outputs) here")
    args = ap.parse_args()
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(args.model)
    model, info = DeepseekV3ForCausalLM.from_pretrained(args.model, dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    model = model.to(args.device).eval()

    t0 = time.time()
    problems = data.eval_set()[: args.limit]
    prompts, outs, texts = run(model, tok, [p["user"] for p in problems], args)
    results, correct, exact = [], 0, 0
    for p, pi, o, t in zip(problems, prompts, outs, texts):
        ok = bool(o) and o[-1] == EOS_ID and t[: -len(data.EOS)].split(data.END_THINK)[-1].strip() == p["answer"]
        ex = t == data.completion(p["a"], p["op"], p["b"])
        correct, exact = correct + ok, exact + ex
        results.append({**p, "correct": ok, "exact_cot": ex, "prompt_ids": pi, "output_ids": o, "text": t})
    n = len(problems)
    tool = eval_tools(model, tok, args)
    report = {"accuracy": correct / n, "correct": correct, "total": n, "exact_cot_rate": exact / n, "tools": tool,
              "device": args.device, "dtype": "float32 (bf16 weights)", "torch": torch.__version__,
              "padded_batches": args.padded, "seconds": round(time.time() - t0, 1),
              "date": time.strftime("%Y-%m-%d"), "results": results}
    with open(args.out, "w") as f:
        json.dump(report, f, ensure_ascii=False)
    print(f"accuracy {correct}/{n} = {correct / n:.4f}, exact CoT {exact / n:.4f}, {report['seconds']}s", flush=True)
    for r in results:
        if not r["correct"]:
            print("WRONG:", repr(r["user"]), "->", repr(r["text"][-80:]))

    if args.expected:
        prompts, outs, texts = run(model, tok, data.FIXED_PROMPTS, args)
        fixed = [{"user": u, "prompt_ids": p, "output_ids": o, "text": t}
                 for u, p, o, t in zip(data.FIXED_PROMPTS, prompts, outs, texts)]
        with open(args.expected, "w") as f:  # one problem per line
            f.write("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in fixed) + "\n]\n")
        for r in fixed:
            print(repr(r["user"]), "->", repr(r["text"].split(data.END_THINK)[-1]))


def eval_tools(model, tok, args):
    """Held-out problems with tools: the call (exact) and the answer to the calculator's result (exact)."""
    cases = data.tool_eval_set(args.limit or 200)
    prompts, outs, texts = run(model, tok, [c["messages"] for c in cases], args, [c["tools"] for c in cases])
    calls = [t == c["call"] for c, t in zip(cases, texts)]
    rprompts, _, rtexts = run(model, tok, [c["result_messages"] for c in cases], args, [c["tools"] for c in cases])
    answers = [t == c["answer"] + data.EOS for c, t in zip(cases, rtexts)]
    n = len(cases)
    print(f"tool calls {sum(calls)}/{n}, answers to tool results {sum(answers)}/{n}", flush=True)
    for c, t, ok in zip(cases, texts, calls):
        if not ok:
            print("WRONG CALL:", repr(c["user"]), "->", repr(t[-120:]))
    if args.tool_cases:
        keep = [{"messages": c["messages"], "tools": c["tools"], "prompt_ids": p, "output_ids": o, "text": t,
                 "result_messages": c["result_messages"], "result_prompt_ids": rp, "result_text": rt}
                for c, p, o, t, rp, rt in list(zip(cases, prompts, outs, texts, rprompts, rtexts))[:8]]
        with open(args.tool_cases, "w") as f:
            f.write("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in keep) + "\n]\n")
    return {"calls_correct": sum(calls), "answers_correct": sum(answers), "total": n,
            "wrong_calls": [{"user": c["user"], "text": t} for c, t, ok in zip(cases, texts, calls) if not ok],
            "wrong_answers": [{"user": c["user"], "text": t} for c, t, ok in zip(cases, rtexts, answers) if not ok]}


if __name__ == "__main__":
    main()
