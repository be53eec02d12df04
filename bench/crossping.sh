#!/bin/bash
# Message round trips across a lab's WAN against competing flows, direct and
# through the gateways (issue 36: do small and mid-size messages, which the
# NAS kernels exchange between computing, take longer through the gateways
# when another flow keeps the WAN's queue full?). One competing iperf3 flow
# per direction (mpi5k lab cross; CROSSFLOWS to change it) runs throughout;
# then, REPEATS times, alternating the modes, SECONDS of ping-pongs of each
# size in SIZES from node-1.site1 to node-1.site2 (sockperf ping-pong, one TCP
# connection, nothing between the messages; a C++ client whose libc connect()
# the shim catches), in each mode:
#   direct        no gateways
#   gw            the gateways as they are (lab map, no keys, GWARGS added)
#   gw-NAME       with more flags: MODES="bbrx=--wan-express-cc bbr;noexp=--wan-express=false"
# Prints each run's median, 99th percentile and mean round trip as sockperf
# measured them (it leaves the first 400 ms of a run out of them).
# The WAN retransmissions are the lab's per-flow counters: only flows the
# lab's flow table still had room for (4096 per link since `lab up`) count.
#
# usage: flock /tmp/mpi5k-heavy.lock bench/crossping.sh LAB OUTDIR [REPEATS] [SECONDS]
#        (root; a lab made with mpi5k lab up, e.g. --cross-mtu 9000; run `make` first)
set -eu
cd "$(dirname "$0")/.."
lab=$1 out=$2
reps=${3:-2}
secs=${4:-20}
sizes=${SIZES:-"26624 57344 163840"}
mpi5k=$PWD/bin/mpi5k
gw=${GWBIN:-$PWD/bin/mpi5k-gateway}
shim=$PWD/bin/libmpi5k.so
map=/run/mpi5k/$lab/sites.conf
modes=${MODES-"bbrx=--wan-express-cc bbr;noexp=--wan-express=false"}
mkdir -p "$out"
command -v sockperf >/dev/null || { echo "needs sockperf (make deps)"; exit 1; }
allow=7600
src=node-1.site1 dst=node-1.site2
# shellcheck source=bench/labgw.sh
. bench/labgw.sh
trap cleanup EXIT

# one MODE SIZE REP: appends "MODE SIZE REP median-rtt-us p99-rtt-us mean-rtt-ms WAN-retrans" to runs.
one() {
	local f="$out/ping-$1-$2-rep$3.txt"
	local sp=(sockperf ping-pong --tcp -i "$(addr $dst)" -p 7600 -m "$2" -t "$secs" --full-rtt --dontwarmup)
	"$mpi5k" lab stats --name "$lab" --json >"$f.wan0"
	if [ "$1" = direct ]; then
		lx "$src" -- "${sp[@]}" >"$f" 2>&1 || true
	else
		lx "$src" -- env LD_PRELOAD="$shim" MPI5K_MAP="$map" GODEBUG=asyncpreemptoff=1 "${sp[@]}" >"$f" 2>&1 || true
	fi
	"$mpi5k" lab stats --name "$lab" --json >"$f.wan1"
	python3 - "$f" "$1" "$2" "$3" <<'EOF' | tee -a "$out/runs"
import json, re, sys
f, mode, size, rep = sys.argv[1:5]
t = open(f).read()
def num(pat):
    m = re.search(pat, t)
    return float(m.group(1)) if m else float("nan")
med = num(r"percentile 50\.000 = *([0-9.]+)")
p99 = num(r"percentile 99\.000 = *([0-9.]+)")
mean = num(r"avg-rtt=([0-9.]+)") / 1e3
def retrans(fn):
    t = 0
    for l in json.load(open(fn))["links"]:
        for fl in l["flows"]:
            if not fl["src"].split(":")[0].endswith(".201"):
                t += fl["retrans"]
    return t
rt = retrans(f + ".wan1") - retrans(f + ".wan0")
print(f"{mode} {size} {rep} {med:.0f} {p99:.0f} {mean:.1f} {rt}")
EOF
}
# the server takes messages up to -m bytes (65507 unless told)
big=$(printf '%s\n' $sizes 65507 | sort -n | tail -1)
lx "$dst" -- sockperf server --tcp -i "$(addr $dst)" -p 7600 -m "$big" >/dev/null 2>&1 &
pids+=($!)
flows=${CROSSFLOWS:-1}
IFS=';' read -ra ms <<<"$modes"
if [ "$flows" -gt 0 ]; then
	# long enough for every run, with room for the gateways' starts
	# shellcheck disable=SC2086
	set -- $sizes
	dur=$((reps * (${#ms[@]} + 2) * ($# * (secs + 10) + 15) + 120))
	"$mpi5k" lab cross --name "$lab" --from site1 --to site2 --flows "$flows" --duration "${dur}s"
	"$mpi5k" lab cross --name "$lab" --from site2 --to site1 --flows "$flows" --duration "${dur}s"
	sleep 5
fi
echo "# mode bytes rep median-round-trip-us p99-round-trip-us mean-round-trip-ms WAN-retransmits-of-everything-but-the-competing-flows ($secs s of ping-pongs $src <-> $dst, $flows competing flow(s) per direction)" | tee "$out/runs"
for rep in $(seq "$reps"); do
	for s in $sizes; do one direct "$s" "$rep"; done
	startgw ${GWARGS:-}
	for s in $sizes; do one gw "$s" "$rep"; done
	stopgw
	for m in "${ms[@]}"; do
		[ -n "$m" ] || continue
		# shellcheck disable=SC2086
		startgw ${GWARGS:-} ${m#*=}
		for s in $sizes; do one "gw-${m%%=*}" "$s" "$rep"; done
		stopgw
	done
done
echo "== min / median over $reps runs: median round trip (us), p99 round trip (us), mean round trip (ms)"
python3 - "$out/runs" <<'EOF' | tee "$out/summary"
import sys
v = {}
for l in open(sys.argv[1]):
    if l.startswith("#"):
        continue
    f = l.split()
    v.setdefault((f[0], int(f[1])), []).append([float(x) for x in f[3:6]])
for k in sorted(v, key=lambda k: (k[1], k[0])):
    a, b, c = (sorted(x[i] for x in v[k]) for i in range(3))
    m = (len(a) - 1) // 2
    print(f"{k[0]:<12} {k[1]:>7} B  {a[0]:8.0f} / {a[m]:8.0f} us   {b[0]:8.0f} / {b[m]:8.0f} us   {c[0]:6.1f} / {c[m]:6.1f} ms")
EOF
