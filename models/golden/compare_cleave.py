#!/usr/bin/env python3
"""Check `cleave generate` against the HF reference of golden case directories.

    python3 compare_cleave.py --cleave target/release/cleave [--device cuda --dtype float32] DIR [DIR ...]

For every prompt of DIR/expected.json it runs `cleave generate --prompt-ids ... --output json`
and compares greedy ids (exact, except after an HF near-tie) and logprobs (within --tol).
Exits non-zero on any disagreement. Needs only the Python standard library.
"""
import argparse
import json
import subprocess
import sys

NEAR_TIE = 1e-3


def check_case(cleave, case_dir, tol, extra=()):
    exp = json.load(open(f"{case_dir}/expected.json"))
    worst, status = 0.0, "ok"
    for i, p in enumerate(exp["prompts"]):
        want = p["token_ids"]
        cmd = [cleave, "generate", "--model", case_dir, "--prompt-ids", ",".join(map(str, p["prompt_ids"])),
               "--max-tokens", str(len(want)), "--ignore-eos", "--output", "json", *extra]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            return f"FAIL prompt {i}: cleave exited {out.returncode}: {out.stderr.strip()[-300:]}", worst
        got = json.loads(out.stdout.strip().splitlines()[-1])
        for step, (a, b) in enumerate(zip(got["token_ids"], want)):
            if a != b:
                if p["margins"][step] < NEAR_TIE:
                    status = f"ok (near-tie at prompt {i} step {step})"
                    break
                return f"FAIL prompt {i} step {step}: cleave {a}, HF {b} (margin {p['margins'][step]:.4f})", worst
            d = abs(got["logprobs"][step] - p["logprobs"][step])
            worst = max(worst, d)
            if d > tol:
                return f"FAIL prompt {i} step {step}: logprob {got['logprobs'][step]:.6f} vs HF {p['logprobs'][step]:.6f}", worst
        if len(got["token_ids"]) != len(want):
            return f"FAIL prompt {i}: {len(got['token_ids'])} tokens, HF {len(want)}", worst
    return status, worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cleave", default="target/release/cleave")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--device", default="cpu", help="cpu | cuda")
    ap.add_argument("--dtype", default=None, help="on cuda: float32 (checked to --tol) or bfloat16")
    ap.add_argument("cases", nargs="+")
    a = ap.parse_args()
    extra = ["--device", a.device] + (["--dtype", a.dtype] if a.dtype else [])
    failed = 0
    print(f"{'case':<40} {'max |dlogprob|':>15}  result")
    for c in a.cases:
        status, worst = check_case(a.cleave, c, a.tol, extra)
        failed += status.startswith("FAIL")
        print(f"{c:<40} {worst:>15.2e}  {status}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
