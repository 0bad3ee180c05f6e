#!/usr/bin/env python3
"""cleave's greedy accuracy on the 1000 held-out problems, and agreement with HF's outputs.

    python3 eval_cleave.py --report eval_report.json [--cleave target/release/cleave] [--jobs 2]

Runs `cleave generate --chat --prompt USER --output json` for every problem of HF's report
(written by eval_hf.py) and prints the accuracy and the share of problems whose output token ids
equal HF's exactly. Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import data  # noqa: E402


def generate(cleave, model, user, device):
    cmd = [cleave, "generate", "--model", model, "--device", device, "--chat", "--prompt", user, "--max-tokens", "400",
           "--output", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-300:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", default=os.path.join(HERE, "eval_report.json"))
    ap.add_argument("--cleave", default=os.path.join(HERE, "../../target/release/cleave"))
    ap.add_argument("--model", default=HERE)
    ap.add_argument("--device", default="cpu", help="cpu | cuda")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--out", default=None, help="write per-problem results here")
    a = ap.parse_args()
    hf = json.load(open(a.report))["results"][: a.limit]
    t0 = time.time()
    with ThreadPoolExecutor(a.jobs) as ex:
        outs = list(ex.map(lambda r: generate(a.cleave, a.model, r["user"], a.device), hf))
    correct = same = errors = 0
    rows = []
    for r, o in zip(hf, outs):
        if "error" in o:
            errors += 1
            rows.append({"user": r["user"], "error": o["error"]})
            continue
        ok = bool(o["token_ids"]) and o["token_ids"][-1] == 1 and o["text"].split(data.END_THINK)[-1].strip() == r["answer"]
        eq = o["token_ids"] == r["output_ids"]
        correct, same = correct + ok, same + eq
        rows.append({"user": r["user"], "answer": r["answer"], "correct": ok, "same_as_hf": eq, "text": o["text"]})
        if not ok or not eq:
            print(f"{'WRONG' if not ok else 'DIFF '}: {r['user']!r} -> {o['text'][-60:]!r} (HF correct: {r['correct']})")
    n = len(hf)
    hf_acc = sum(r["correct"] for r in hf) / n
    print(f"problems {n} | cleave accuracy {correct}/{n} = {correct / n:.4f} | HF accuracy {hf_acc:.4f} | "
          f"identical to HF {same}/{n} = {same / n:.4f} | errors {errors} | {time.time() - t0:.0f}s with {a.jobs} jobs")
    if a.out:
        json.dump(rows, open(a.out, "w"), ensure_ascii=False, indent=0)
    sys.exit(0 if errors == 0 else 1)


if __name__ == "__main__":
    main()
