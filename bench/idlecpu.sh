#!/bin/bash
# The gateways' CPU while their links are up and carry nothing, on the lab's
# emulated WAN (20 ms RTT, 200 Mbit/s): idle, and beside a competing TCP flow
# (`mpi5k lab cross`) that saturates the WAN bottleneck the gateways' links
# cross too. Phases alternate, REPEATS times each; every phase measures each
# gateway's CPU (user + system, from its threads' schedstat) over SECONDS of
# wall time and prints it as % of one core; a last block gives min / median.
# CPU seconds of the gateway processes do not depend on what else loads the
# machine (the 2 vCPUs are shared), wall-clock figures would.
# gateway/ BenchmarkIdleCPU measures the same on loopback, without a
# bottleneck.
#
# usage: flock /tmp/mpi5k-heavy.lock bench/idlecpu.sh [SECONDS] [REPEATS]
#        (root; run `make` first; GWARGS="..." adds gateway flags, GW=PATH
#        runs another gateway binary, e.g. one built at an older commit)
set -eu
cd "$(dirname "$0")/.."
secs=${1:-10}
reps=${2:-3}
name=idlecpu$$
mpi5k=$PWD/bin/mpi5k
gw=${GW:-$PWD/bin/mpi5k-gateway}
dir=$(mktemp -d)
pids=()
cleanup() {
	for f in "$dir"/*.ready; do [ -e "$f" ] && kill "$(awk '{print $3}' "$f")" 2>/dev/null; done
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	"$mpi5k" lab cross --name "$name" --stop >/dev/null 2>&1 || true
	"$mpi5k" lab down --name "$name" >/dev/null 2>&1 || true
	rm -rf "$dir"
}
trap cleanup EXIT

"$mpi5k" lab up --name "$name" --nodes 1 --rtt 20ms --wan-rate 200mbit >"$dir/up.log" 2>&1 ||
	{ cat "$dir/up.log"; exit 1; }
map=/run/mpi5k/$name/sites.conf
# The gateway host's address: the lab's hosts file maps gw.SITE.
gwaddr() { awk -v h="gw.$1" '$2 == h { print $1; exit }' "/run/mpi5k/$name/hosts"; }
# metrics SITE NAME: the sum of a metric family of SITE's gateway.
metric() {
	"$mpi5k" lab exec --name "$name" "gw.$1" -- curl -s "http://$(gwaddr "$1"):9105/metrics" |
		awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $2 } END { printf "%.0f", s }'
}
for site in site1 site2; do
	# shellcheck disable=SC2086
	"$mpi5k" lab exec --name "$name" "gw.$site" -- "$gw" --map "$map" --site "$site" \
		--ready-file "$dir/$site.ready" --metrics "$(gwaddr "$site"):9105" --log-level warn ${GWARGS:-} 2>"$dir/$site.log" &
	pids+=($!)
done
for site in site1 site2; do
	for _ in $(seq 300); do [ -e "$dir/$site.ready" ] && break; sleep 0.1; done
	[ -e "$dir/$site.ready" ] || { echo "gateway $site not ready:"; cat "$dir/$site.log"; exit 1; }
done
# The ready file holds "ready SITE PID".
gwpid() { awk '{print $3}' "$dir/$1.ready"; }
cpu_ns() {
	local sum=0 t
	for t in /proc/"$1"/task/*/schedstat; do
		read -r ns _ <"$t" && sum=$((sum + ns))
	done
	echo "$sum"
}
sleep 2 # priming done, first samples taken
# What priming cost at the start: PAD filler and the WAN retransmissions
# so far (the links carried nothing else).
for site in site1 site2; do
	echo "$site: priming sent $(metric "$site" mpi5k_wan_pad_bytes_total) filler bytes;" \
		"$(metric "$site" mpi5k_wan_tcp_retransmits_total) WAN retransmissions since start"
done

# phase LABEL: one measurement of both gateways.
phase() {
	local a0 b0 t0 a1 b1 t1
	a0=$(cpu_ns "$(gwpid site1)") b0=$(cpu_ns "$(gwpid site2)") t0=$(date +%s%N)
	sleep "$secs"
	a1=$(cpu_ns "$(gwpid site1)") b1=$(cpu_ns "$(gwpid site2)") t1=$(date +%s%N)
	awk -v l="$1" -v a=$((a1 - a0)) -v b=$((b1 - b0)) -v w=$((t1 - t0)) \
		'BEGIN { printf "%-6s site1 %.3f site2 %.3f\n", l, 100 * a / w, 100 * b / w }' | tee -a "$dir/phases"
}
echo "% of one core per gateway, links up, no streams, ${secs}s per phase"
for _ in $(seq "$reps"); do
	phase idle
	"$mpi5k" lab cross --name "$name" --from site1 --to site2 --flows 1 --duration $((secs + 5))s >/dev/null
	sleep 2 # the flow fills the bottleneck
	phase cross
	"$mpi5k" lab cross --name "$name" --stop >/dev/null
	sleep 1
done
for site in site1 site2; do
	echo "$site: $(metric "$site" mpi5k_wan_tcp_retransmits_total) WAN retransmissions at the end"
done
echo "== min / median over $reps phases"
for l in idle cross; do
	for s in site1 site2; do
		awk -v l=$l -v s=$s '$1 == l { for (i = 2; i < NF; i += 2) if ($i == s) print $(i + 1) }' "$dir/phases" | sort -n |
			awk -v l=$l -v s=$s '{ v[NR] = $1 } END { printf "%-6s %s %.3f / %.3f\n", l, s, v[1], v[int((NR + 1) / 2)] }'
	done
done
