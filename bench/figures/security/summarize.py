#!/usr/bin/env python3
"""Min and median of each BenchmarkSecure row and metric over the runs in
the raw file given (go test -bench output, one or more runs)."""
import re
import statistics
import sys

rows = {}
for line in open(sys.argv[1]):
    m = re.match(r'^BenchmarkSecure/(\S+?)-\d+\s+\d+\s+(.*)$', line)
    if not m:
        continue
    f = m.group(2).split()
    for v, unit in zip(f[::2], f[1::2]):
        rows.setdefault(m.group(1), {}).setdefault(unit, []).append(float(v))
for name, metrics in rows.items():
    parts = []
    for unit in ("p50-us", "child-cpu-us/op", "Gbit/s-per-core-a", "Gbit/s-per-core-b", "Gbit/s"):
        if unit in metrics:
            v = metrics[unit]
            parts.append(f"{unit} {min(v):.2f} / {statistics.median(v):.2f} (max {max(v):.2f}, n={len(v)})")
    print(f"{name:26s} " + "; ".join(parts))
