#!/usr/bin/env python3
"""Quantize tiny-r1 to AutoAWQ "gemm" int4 (models/tiny-r1-awq). Standard library only.

    python3 models/tiny-r1-awq/quantize_awq.py [--src models/tiny-r1] [--out models/tiny-r1-awq]
        [--group-size 32]

Every linear layer inside the decoder (attention, dense MLP, routed and shared experts) becomes
`qweight` / `qzeros` / `scales` in AutoAWQ's layout (REFERENCE.md section 4: int32 [in, out/8] with
nibble i holding column 8 * word + [0,2,4,6,1,3,5,7][i], zero points likewise, f16 scales
[in/G, out]); embeddings, norms, the router gate and lm_head stay bf16, as in DeepSeek-V3-AWQ.
Per group of G input channels: asymmetric min/max quantization, W ~= (q - z) * s, with the range
shrunk by the clip ratio (1.0, 0.95, ... 0.75) that minimizes the group's squared weight error.
This is round-to-nearest with a clip search: it does not rescale channels by activation
statistics as AutoAWQ's search does. Group 32 because tiny-r1's expert intermediate size is 96.
"""
import argparse
import json
import os
import shutil
import struct

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
CLIPS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return header, raw[8 + n:]


def bf16_values(buf):
    words = struct.unpack(f"<{len(buf) // 2}H", buf)
    return list(struct.unpack(f"<{len(words)}f", struct.pack(f"<{len(words)}I", *(w << 16 for w in words))))


def f16(x):
    return struct.unpack("<e", struct.pack("<e", x))[0]


def quant_group(vals):
    """(scale as f16, zero, levels) minimizing sum((w - (q - z) s)^2) over the clip ratios."""
    lo, hi = min(vals), max(vals)
    best = None
    for c in CLIPS:
        mn, mx = lo * c, hi * c
        s = f16(max(mx - mn, 1e-5) / 15.0)
        if s == 0.0:
            s = f16(1e-5)
        z = min(15, max(0, round(-mn / s)))
        q = [min(15, max(0, round(v / s) + z)) for v in vals]
        err = sum((v - (qi - z) * s) ** 2 for v, qi in zip(vals, q))
        if best is None or err < best[0]:
            best = (err, s, z, q)
    return best[1], best[2], best[3]


def pack_rows(rows, cols):
    """rows x cols levels (0..15) -> int32 words [rows, cols / 8] in AutoAWQ order."""
    out = []
    for r in range(len(rows)):
        row = rows[r]
        for w in range(cols // 8):
            word = 0
            for i, o in enumerate(ORDER):
                word |= row[8 * w + o] << (4 * i)
            out.append(word)
    return struct.pack(f"<{len(out)}I", *out)


def quantize(w, out_f, in_f, G):
    """w: [out, in] row-major floats -> (qweight bytes, qzeros bytes, scales bytes, max |error|)."""
    groups = in_f // G
    q_t = [[0] * out_f for _ in range(in_f)]  # [in, out]
    z_t = [[0] * out_f for _ in range(groups)]
    s_t = [[0.0] * out_f for _ in range(groups)]
    worst = 0.0
    for n in range(out_f):
        row = w[n * in_f:(n + 1) * in_f]
        for g in range(groups):
            vals = row[g * G:(g + 1) * G]
            s, z, q = quant_group(vals)
            s_t[g][n], z_t[g][n] = s, z
            for j, qj in enumerate(q):
                q_t[g * G + j][n] = qj
                worst = max(worst, abs(vals[j] - (qj - z) * s))
    scales = b"".join(struct.pack(f"<{out_f}e", *r) for r in s_t)
    return pack_rows(q_t, out_f), pack_rows(z_t, out_f), scales, worst


def is_target(name):
    if not name.startswith("model.layers.") or ".mlp.gate." in name:
        return False
    return name.endswith("_proj.weight") or name.endswith("_proj_with_mqa.weight")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=os.path.join(here, "../tiny-r1"))
    ap.add_argument("--out", default=here)
    ap.add_argument("--group-size", type=int, default=32)
    a = ap.parse_args()
    G = a.group_size
    header, data = read_safetensors(os.path.join(a.src, "model.safetensors"))
    tensors = {}  # name -> (dtype, shape, bytes)
    worst = 0.0
    for name in sorted(header):
        info = header[name]
        lo, hi = info["data_offsets"]
        buf = data[lo:hi]
        if not is_target(name):
            tensors[name] = (info["dtype"], info["shape"], buf)
            continue
        assert info["dtype"] == "BF16", name
        out_f, in_f = info["shape"]
        assert in_f % G == 0 and out_f % 8 == 0, (name, info["shape"], G)
        qw, qz, sc, err = quantize(bf16_values(buf), out_f, in_f, G)
        worst = max(worst, err)
        base = name[: -len(".weight")]
        tensors[base + ".qweight"] = ("I32", [in_f, out_f // 8], qw)
        tensors[base + ".qzeros"] = ("I32", [in_f // G, out_f // 8], qz)
        tensors[base + ".scales"] = ("F16", [in_f // G, out_f], sc)
    meta, off, blobs = {"__metadata__": {"format": "pt", "quantizer": "models/tiny-r1-awq/quantize_awq.py"}}, 0, []
    for name in sorted(tensors):
        dtype, shape, buf = tensors[name]
        meta[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(buf)]}
        off += len(buf)
        blobs.append(buf)
    hb = json.dumps(meta, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    cfg["quantization_config"] = {"bits": 4, "group_size": G, "modules_to_not_convert": None,
                                  "quant_method": "awq", "version": "gemm", "zero_point": True}
    cfg["torch_dtype"] = "float16"
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    for fn in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(a.src, fn), os.path.join(a.out, fn))
    print(f"wrote {a.out}: {len(tensors)} tensors, {off} bytes of weights, group {G}, "
          f"max |w - dequant(w)| {worst:.4g}")


if __name__ == "__main__":
    main()
