import re, sys, glob, os
d = sys.argv[1]
v = {}
for f in sorted(glob.glob(os.path.join(d, "ping-*.txt"))):
    m = re.match(r"ping-(.*)-(\d+)-rep(\d+)\.txt$", os.path.basename(f))
    mode, size, rep = m.group(1), int(m.group(2)), int(m.group(3))
    t = open(f).read()
    a = re.search(r"reps=(\d+) lat_us_min=([0-9.]+) lat_us_med=([0-9.]+)", t)
    w = re.search(r"time_s=([0-9.]+)", t)
    if not a or not w:
        continue
    n = int(a.group(1))
    v.setdefault((mode, size), []).append((float(a.group(2)) / 1e3, float(a.group(3)) / 1e3, float(w.group(1)) * 1e3 / n))
order = ["direct", "gw", "gw-bbrx", "gw-noexp", "gw-k4q0"]
print("mode size  | half-RTT min ms | half-RTT median ms, min/med over reps | mean RTT ms, min/med over reps | runs")
for size in sorted({k[1] for k in v}):
    for mode in sorted({k[0] for k in v}, key=lambda x: order.index(x) if x in order else 99):
        x = v.get((mode, size))
        if not x:
            continue
        mins = sorted(y[0] for y in x); meds = sorted(y[1] for y in x); means = sorted(y[2] for y in x)
        import statistics as st
        print(f"{mode:<9} {size:>6} | {mins[0]:6.1f} | {meds[0]:6.1f} / {st.median(meds):6.1f} | {means[0]:6.1f} / {st.median(means):6.1f} | {len(x)}")
