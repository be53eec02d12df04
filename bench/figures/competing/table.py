# table.py SET/results.json...: one markdown table of time / direct per
# kernel and gateway mode over the sets given (each a `mpi5k bench` run
# with modes direct first), as "median (min-max)" of the per-repetition
# ratios: each repetition's time over the same repetition's direct time,
# since the modes alternate within a repetition and share its conditions.
# Then, per set, the gateways' CPU and the WAN shares (job and competing
# flows, Mbit/s, medians).
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

def med(xs):
    return statistics.median(xs) if xs else None

sets = [load(fn) for fn in sys.argv[1:]]
for fn, (d, t) in zip(sys.argv[1:], sets):
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
            cells.append(f"{med(r):.2f} ({min(r):.2f}-{max(r):.2f})" if r else "-")
        print(f"| {m} | " + " | ".join(cells) + " |")
    print()
    print("| medians | " + " | ".join(works) + " |")
    print("|---" * (len(works) + 1) + "|")
    for m in ["direct"] + modes:
        cells = []
        for w in works:
            ss = list(t.get((w, m), {}).values())
            if not ss:
                cells.append("-")
                continue
            job = med([s["result"]["wan_bytes"] * 8 / s["result"]["time_s"] / 1e6 for s in ss])
            comp = med([s["competing"]["bytes"] * 8 / s["competing"]["seconds"] / 1e6
                        for s in ss if s.get("competing") and s["competing"]["seconds"] > 0])
            cpu = med([sum(g["cpu_s"] for g in s.get("gateways") or []) for s in ss])
            sec = med([s["result"]["time_s"] for s in ss])
            c = f"{sec:.1f} s, job {job:.0f} / others {comp:.0f} Mbit/s" if comp is not None else f"{sec:.1f} s, job {job:.0f} Mbit/s"
            if m != "direct":
                c += f", gw CPU {cpu:.2f} s"
            cells.append(c)
        print(f"| {m} | " + " | ".join(cells) + " |")
