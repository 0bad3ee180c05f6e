#!/usr/bin/env python3
"""Sums `ncu --csv --metrics gpu__time_duration.sum` output per kernel name: the real GPU time of
each kernel of a profiled step (the bench opens the profiler range around its profiled step).
Usage: ncu_table.py CSV [TITLE] [HOW_MANY_KERNELS, default 18]"""
import csv
import sys
from collections import defaultdict

rows = defaultdict(lambda: [0.0, 0])
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    us = v / 1000.0 if unit in ("ns", "nsecond") else v * 1000.0 if unit in ("ms", "msecond") else v
    name = r["Kernel Name"].split("(")[0][:60]
    rows[name][0] += us
    rows[name][1] += 1
total = sum(v[0] for v in rows.values())
n = sum(v[1] for v in rows.values())
print(f"{sys.argv[2] if len(sys.argv) > 2 else ''}: {n} kernels, {total / 1000:.3f} ms of GPU time")
for name, (us, c) in sorted(rows.items(), key=lambda kv: -kv[1][0])[: int(sys.argv[3]) if len(sys.argv) > 3 else 18]:
    print(f"  {name:60s} {c:4d} x {us / c:8.2f} us = {us / 1000:7.3f} ms")
