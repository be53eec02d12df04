#!/bin/bash
# The share of a lab's WAN bottleneck that node-to-node traffic gets against
# competing flows, direct and through the gateways (issue 36: direct, every
# rank pair has a TCP connection of its own across the WAN; through the
# gateways all of a site pair's streams share the bulk link's connections).
# One competing iperf3 flow per direction (mpi5k lab cross, CROSSFLOWS to
# change it) runs throughout; then, REPEATS times, alternating the modes,
# iperf3 from node-1.site1 to node-1.site2 with 1 and with 4 parallel
# streams for SECS seconds (the first 2 s omitted), in each mode:
#   direct        no gateways
#   gw            the gateways as they are (lab map, no keys, GWARGS added)
#   gw-NAME       the gateways with more flags: MODES="k2=--wan-conns 2;k4=--wan-conns 4"
# Prints each run's throughput and its share of the WAN rate, then min /
# median per mode and stream count.
#
# usage: flock /tmp/mpi5k-heavy.lock bench/crossshare.sh LAB OUTDIR [REPEATS] [SECS]
#        (root; a lab made with mpi5k lab up, e.g. --cross-mtu 9000; run `make` first)
set -eu
cd "$(dirname "$0")/.."
lab=$1 out=$2
reps=${3:-3}
secs=${4:-12}
mpi5k=$PWD/bin/mpi5k
gw=${GWBIN:-$PWD/bin/mpi5k-gateway}
shim=$PWD/bin/libmpi5k.so
map=/run/mpi5k/$lab/sites.conf
rate=$(awk '/wan-rate=/ { for (i = 1; i <= NF; i++) if ($i ~ /^wan-rate=/) { split($i, x, "="); print x[2] } }' "$map")
modes=${MODES-"k2=--wan-conns 2;k4=--wan-conns 4"}
mkdir -p "$out"
allow=5201
src=node-1.site1 dst=node-1.site2
# shellcheck source=bench/labgw.sh
. bench/labgw.sh
trap cleanup EXIT

# one MODE P REP: one iperf3 run; appends "MODE P REP Mbit/s share retrans" to runs.
one() {
	local f="$out/iperf-$1-P$2-rep$3.json"
	"$mpi5k" lab stats --name "$lab" --json >"$f.wan0"
	head -1 /proc/stat >"$f.cpu0"
	if [ "$1" = direct ]; then
		lx "$src" -- iperf3 -c "$(addr $dst)" -p 5201 -P "$2" -t "$secs" -O 2 -J >"$f" || true
	else
		lx "$src" -- env LD_PRELOAD="$shim" MPI5K_MAP="$map" GODEBUG=asyncpreemptoff=1 \
			iperf3 -c "$(addr $dst)" -p 5201 -P "$2" -t "$secs" -O 2 -J >"$f" || true
	fi
	head -1 /proc/stat >"$f.cpu1"
	"$mpi5k" lab stats --name "$lab" --json >"$f.wan1"
	python3 - "$f" "$1" "$2" "$3" "$rate" <<'EOF' | tee -a "$out/runs"
import json, sys
f, mode, p, rep, rate = sys.argv[1:6]
try:
    j = json.load(open(f))
    bps = j["end"]["sum_received"]["bits_per_second"]
    rt = j["end"]["sum_sent"].get("retransmits", -1)
    secs = j["end"]["sum_received"]["seconds"]
except Exception as e:
    print(f"{mode} {p} {rep} nan nan nan  # {e}")
    sys.exit(0)
# WAN site1 -> site2 between the two stats snapshots (the whole run, omitted
# seconds and start-up included): the competing flows' bytes (traffic hosts,
# .201) and everything else, as shares of the rate over the wall time; the
# queue drops of everything else; the machine's idle CPU.
def flows(fn):
    d = {}
    for l in json.load(open(fn))["links"]:
        if l["from"] == "site1" and l["to"] == "site2":
            for fl in l["flows"]:
                d[(fl["src"], fl["dst"])] = (fl["bytes"], fl["queue_drops"])
    return d
a, b = flows(f + ".wan0"), flows(f + ".wan1")
c0 = [int(x) for x in open(f + ".cpu0").read().split()[1:]]
c1 = [int(x) for x in open(f + ".cpu1").read().split()[1:]]
d = [y - x for x, y in zip(c0, c1)]
wall = sum(d) / 2 / 100.0  # 2 CPUs, USER_HZ 100
idle = (d[3] + d[4]) / sum(d)
xb = ob = od = 0
for k, (v, q) in b.items():
    v0, q0 = a.get(k, (0, 0))
    if k[0].split(":")[0].endswith(".201"):
        xb += v - v0
    else:
        ob += v - v0
        od += q - q0
r = float(rate)
print(f"{mode} {p} {rep} {bps/1e6:.1f} {bps/r:.3f} {rt} wan-ours {8*ob/wall/r:.3f} wan-cross {8*xb/wall/r:.3f} drops-ours {od} idle {idle:.2f}")
EOF
}

lx "$dst" -- iperf3 -s -B "$(addr $dst)" -p 5201 -D -I "$out/iperf3-server.pid" >/dev/null 2>&1
sleep 0.5
pids+=("$(cat "$out/iperf3-server.pid")")
flows=${CROSSFLOWS:-1}
if [ "$flows" -gt 0 ]; then
	dur=$((reps * (2 + 8 * (secs + 4)) + 120))
	"$mpi5k" lab cross --name "$lab" --from site1 --to site2 --flows "$flows" --duration "${dur}s"
	"$mpi5k" lab cross --name "$lab" --from site2 --to site1 --flows "$flows" --duration "${dur}s"
	sleep 5 # the competing flows past their start-up
fi
"$mpi5k" lab stats --name "$lab" --json >"$out/stats-before.json"
echo "# mode streams rep Mbit/s share-of-$rate retransmits [WAN site1->site2 over the run: ours, competing, as shares; our queue drops; idle CPU] (iperf3 $src -> $dst, ${secs}s, $flows competing flow(s) per direction)" | tee "$out/runs"
for rep in $(seq "$reps"); do
	for p in 1 4; do one direct "$p" "$rep"; done
	startgw ${GWARGS:-}
	for p in 1 4; do one gw "$p" "$rep"; done
	stopgw
	IFS=';' read -ra ms <<<"$modes"
	for m in "${ms[@]}"; do
		[ -n "$m" ] || continue
		# shellcheck disable=SC2086
		startgw ${GWARGS:-} ${m#*=}
		for p in 1 4; do one "gw-${m%%=*}" "$p" "$rep"; done
		stopgw
	done
done
"$mpi5k" lab stats --name "$lab" --json >"$out/stats-after.json"
echo "== min / median share of the WAN rate over $reps runs"
awk '!/^#/ { print $1, $2, $5 }' "$out/runs" | sort -k1,1 -k2,2n -k3,3n |
	awk '{ k = $1 " P" $2; v[k, ++n[k]] = $3; if (!(k in seen)) { seen[k] = 1; o[++m] = k } }
	END { for (i = 1; i <= m; i++) { k = o[i]; printf "%-12s %.3f / %.3f\n", k, v[k, 1], v[k, int((n[k] + 1) / 2)] } }' |
	tee "$out/summary"
