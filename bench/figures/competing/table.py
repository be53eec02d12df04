# table.py SET/results.json...: for each set given (a `mpi5k bench` run
# with mode direct among its modes), a markdown table of time / direct per
# kernel and gateway mode as "median (min-max)" of the per-repetition
# ratios: each repetition's time over the same repetition's direct time,
# since the modes alternate within a repetition and share its conditions
# (the bench's own summary has ratios of medians and of minimums only).
# Then the bench's summary medians: time, the WAN rates of the job and of
# the competing flows, the gateways' CPU; last, the gateways' CPU split
# into while the job ran + before it (from their start to the job's launch:
# TLS, priming), both gateways, medians a run, and that CPU during the job
# as a share of one core (its median over the median time).
import json, statistics, sys

def load(fn):
    d = json.load(open(fn))
    t = {}  # (workload, mode) -> {rep: sample}
    for s in d["samples"]:
        if s.get("error") or not s.get("result"):
            continue
        t.setdefault((s["workload"], s["mode"]), {})[s["rep"]] = s
    return d, t

def ratios(t, w, m):
    ref, got = t.get((w, "direct"), {}), t.get((w, m), {})
    return [got[r]["result"]["time_s"] / ref[r]["result"]["time_s"] for r in got if r in ref]

for fn in sys.argv[1:]:
    d, t = load(fn)
    modes = [m["name"] for m in d["modes"] if m["name"] != "direct"]
    works = []
    for s in d["samples"]:
        if s["workload"] not in works:
            works.append(s["workload"])
    print(f"\n{fn}: {d['header']['lab']}, commit {d['header']['commit'][:7]}, {d['header']['date']}\n")
    print("| time / direct, median (min-max) | " + " | ".join(works) + " |")
    print("|---" * (len(works) + 1) + "|")
    for m in modes:
        cells = []
        for w in works:
            r = ratios(t, w, m)
            cells.append(f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})" if r else "-")
        print(f"| {m} | " + " | ".join(cells) + " |")
    print()
    # The medians are the bench's own summary of each cell.
    cell = {(r["workload"], r["mode"]): r for r in d["summary"]}
    print("| medians | " + " | ".join(works) + " |")
    print("|---" * (len(works) + 1) + "|")
    for m in ["direct"] + modes:
        cells = []
        for w in works:
            r = cell.get((w, m))
            if r is None or r.get("median_s") is None:
                cells.append("-")
                continue
            c = f"{r['median_s']:.1f} s, job {r['job_mbit_s']:.0f}"
            if r.get("competing_mbit_s") is not None:
                c += f" / others {r['competing_mbit_s']:.0f}"
            c += " Mbit/s"
            if m != "direct":
                c += f", gw CPU {r['gw_cpu_s']:.2f} s"
            cells.append(c)
        print(f"| {m} | " + " | ".join(cells) + " |")
    print()
    print("| CPU, s: job + before | " + " | ".join(works) + " |")
    print("|---" * (len(works) + 1) + "|")
    for m in modes:
        cells, shares = [], []
        for w in works:
            # The job's CPU and time are the summary's medians; only the
            # CPU before the job is not in it.
            r = cell.get((w, m))
            if r is None or r.get("gw_cpu_s") is None:
                cells.append("-")
                continue
            before = [sum(g["cpu_total_s"] - g["cpu_s"] for g in s["gateways"])
                      for s in t.get((w, m), {}).values() if s.get("gateways")]
            cells.append(f"{r['gw_cpu_s']:.2f} + {statistics.median(before):.2f}")
            shares.append(r["gw_cpu_s"] / r["median_s"])
        share = f" ({min(shares) * 100:.0f}-{max(shares) * 100:.0f} % of a core)" if shares else ""
        print(f"| {m}{share} | " + " | ".join(cells) + " |")
