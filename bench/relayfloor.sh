#!/bin/bash
# The CPU a site pair's relays take per GiB carried over the lab's emulated
# WAN (20 ms RTT, 200 Mbit/s): the gateways against the simplest relays that
# do the same hop, two socat processes (node -> socat on gw.site1 -> WAN ->
# socat on gw.site2 -> node), with the same bulk transfer (iperf3, one TCP
# stream, BYTES) through each in turn, REPEATS times, alternating. Each
# relay runs in a cgroup of its own, so its CPU (user + system, cpu.stat)
# counts every thread and socat's forked children. A ratio of the two is
# what the gateways add over a plain user-space copy at each hop; the rest
# is what any split-TCP relay costs on this machine (issue 36). A third
# pair, two gorelay processes (bench/gorelay: Go's standard library, io.Copy
# each way) on the same hop, is what any relay written in Go costs: the part
# of the gateways' CPU that Go's runtime would take in any Go relay.
#
# Then small messages: sockperf ping-pong over one TCP connection, PINGSECS
# seconds for each size in SIZES, alternating four modes: direct (node to
# node, no relay), gw (the gateways: the shim preloaded into sockperf, a C++
# program whose libc connect() the shim catches), gorelay and socat (the two
# chains). Prints the median and 99th percentile round trip sockperf measured,
# the relays' CPU per round trip (over the whole client run, divided by the
# replies it received) and their context switches per round trip (voluntary
# and involuntary, every thread of every process in the relays' cgroups,
# read from /proc every 0.2 s during the run so that socat's forked children
# count too; a child's last 0.2 s before it exits is missed).
#
# usage: flock /tmp/mpi5k-heavy.lock bench/relayfloor.sh [BYTES] [REPEATS]
#        (root; run `make` first; builds bench/gorelay with GO, default
#        /usr/local/go/bin/go, or go on the PATH; GWARGS="..." adds gateway flags;
#        SIZES="64 1024 16384 57344" and PINGSECS=6 for the ping-pongs)
set -eu
cd "$(dirname "$0")/.."
bytes=${1:-512M}
reps=${2:-3}
name=floor$$
mpi5k=$PWD/bin/mpi5k
gw=$PWD/bin/mpi5k-gateway
shim=$PWD/bin/libmpi5k.so
dir=$(mktemp -d)
# CPU accounting: cgroup v2 (cpu.stat) where it is mounted, else v1's
# cpuacct controller.
if [ -e /sys/fs/cgroup/cgroup.controllers ]; then
	cg=/sys/fs/cgroup/mpi5k-floor$$ v2=1
elif [ -d /sys/fs/cgroup/cpuacct ]; then
	cg=/sys/fs/cgroup/cpuacct/mpi5k-floor$$ v2=0
elif [ -e /sys/fs/cgroup/unified/cgroup.procs ]; then
	cg=/sys/fs/cgroup/unified/mpi5k-floor$$ v2=1
else
	echo "no cgroup hierarchy to account CPU in"; exit 1
fi
lab=$name out=$dir
# shellcheck source=bench/labgw.sh
. bench/labgw.sh
cleanup() {
	stopgw
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	"$mpi5k" lab down --name "$name" >/dev/null 2>&1 || true
	for g in "$cg"/*/; do [ -d "$g" ] && rmdir "$g" 2>/dev/null; done
	rmdir "$cg" 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT
gocmd=${GO:-/usr/local/go/bin/go}
[ -x "$gocmd" ] || gocmd=go
"$gocmd" build -o "$dir/gorelay" ./bench/gorelay
for t in socat iperf3 sockperf; do
	command -v $t >/dev/null || { echo "needs socat, iperf3 and sockperf (make deps)"; exit 1; }
done
# the ping-pong server's port
pport=7600

"$mpi5k" lab up --name "$name" --nodes 1 --rtt 20ms --wan-rate 200mbit >"$dir/up.log" 2>&1 ||
	{ cat "$dir/up.log"; exit 1; }
map=/run/mpi5k/$name/sites.conf
src=$("$mpi5k" lab hosts --name "$name" --site site1 | head -1)
dst=$("$mpi5k" lab hosts --name "$name" --site site2 | head -1)

mkdir -p "$cg"
# into GROUP PID: the process and what it forks from now on count in GROUP.
into() { mkdir -p "$cg/$1" && echo "$2" >"$cg/$1/cgroup.procs"; }
usec() {
	if [ "$v2" = 1 ]; then
		awk '$1 == "usage_usec" { print $2 }' "$cg/$1/cpu.stat"
	else
		echo $(($(cat "$cg/$1/cpuacct.usage") / 1000))
	fi
}

lx "$dst" -- iperf3 -s -B "$(addr "$dst")" -p 5201 >/dev/null 2>&1 &
pids+=($!)
# the server takes messages up to -m bytes (65507 unless told)
sizes=${SIZES:-"64 1024 16384 57344"}
# shellcheck disable=SC2086
big=$(printf '%s\n' $sizes 65507 | sort -n | tail -1)
lx "$dst" -- sockperf server --tcp -i "$(addr "$dst")" -p "$pport" -m "$big" >/dev/null 2>&1 &
pids+=($!)
allow=5201,$pport
# shellcheck disable=SC2086
startgw ${GWARGS:-}
into gw-site1 "${gwpids[0]}"
into gw-site2 "${gwpids[1]}"
# Two chains: 7701 -> 7702 -> iperf3, 7711 -> 7712 -> the sockperf server.
for c in "7701 7702 5201" "7711 7712 $pport"; do
	set -- $c
	lx gw.site2 -- socat "TCP-LISTEN:$2,bind=$(addr gw.site2),reuseaddr,fork,nodelay" "TCP:$(addr "$dst"):$3,nodelay" &
	pids+=($!)
	lx gw.site1 -- socat "TCP-LISTEN:$1,bind=$(addr gw.site1),reuseaddr,fork,nodelay" "TCP:$(addr gw.site2):$2,nodelay" &
	pids+=($!)
done
sleep 1
# The socat processes are the lab-exec children's children: find them by
# their listening port.
for p in $(pgrep -x socat); do
	case "$(tr '\0' ' ' </proc/"$p"/cmdline)" in
	*TCP-LISTEN:77[01]1*) into socat-site1 "$p" ;;
	*TCP-LISTEN:77[01]2*) into socat-site2 "$p" ;;
	esac
done
[ -d "$cg/socat-site1" ] && [ -d "$cg/socat-site2" ] || { echo "socat relays not found"; exit 1; }
# The same two chains of gorelay: 7721 -> 7722 -> iperf3, 7731 -> 7732 ->
# the sockperf server.
for c in "7721 7722 5201" "7731 7732 $pport"; do
	set -- $c
	lx gw.site2 -- "$dir/gorelay" -listen "$(addr gw.site2):$2" -to "$(addr "$dst"):$3" &
	pids+=($!)
	lx gw.site1 -- "$dir/gorelay" -listen "$(addr gw.site1):$1" -to "$(addr gw.site2):$2" &
	pids+=($!)
done
sleep 1
for p in $(pgrep -x gorelay); do
	case "$(tr '\0' ' ' </proc/"$p"/cmdline)" in
	"$dir/gorelay -listen "*:77[23]1*) into gorelay-site1 "$p" && pids+=("$p") ;;
	"$dir/gorelay -listen "*:77[23]2*) into gorelay-site2 "$p" && pids+=("$p") ;;
	esac
done
[ -d "$cg/gorelay-site1" ] && [ -d "$cg/gorelay-site2" ] || { echo "gorelay relays not found"; exit 1; }
sleep 2 # gateways primed

# csw GROUP...: "TID count" for every thread of every process in the
# groups, count its voluntary and involuntary context switches so far.
csw() {
	local g p f=()
	for g in "$@"; do
		for p in $(<"$cg/$g/cgroup.procs"); do f+=(/proc/"$p"/task/*/status); done
	done
	[ ${#f[@]} -gt 0 ] || return 0
	cat "${f[@]}" 2>/dev/null | awk '$1 == "Pid:" { t = $2 } $1 ~ /ctxt_switches:$/ { n[t] += $2 } END { for (t in n) print t, n[t] }'
}
# cswwatch GROUP FILE: csw GROUP-site1 GROUP-site2 into FILE every 0.2 s
# until killed (a forked child's counts are gone once it exits).
cswwatch() {
	while :; do
		csw "$1-site1" "$1-site2" >>"$2"
		sleep 0.2
	done
}
# cswdelta BEFORE DURING: the switches since BEFORE, the most seen of each
# thread less its count in BEFORE (0 for a thread born since).
cswdelta() {
	awk 'FNR == NR { b[$1] = $2; next } $2 > m[$1] { m[$1] = $2 }
		END { for (t in m) s += m[t] - b[t]; print s + 0 }' "$1" "$2"
}

# run MODE: one transfer; prints seconds, Mbit/s and each relay's CPU.
run() {
	local a0 b0 a1 b1 t0 t1 out
	a0=$(usec "$1-site1") b0=$(usec "$1-site2") t0=$(date +%s%N)
	if [ "$1" = gw ]; then
		out=$(lx "$src" -- env LD_PRELOAD="$shim" MPI5K_MAP="$map" GODEBUG=asyncpreemptoff=1 \
			iperf3 -c "$(addr "$dst")" -p 5201 -n "$bytes" -J)
	else
		local port=7701
		[ "$1" = gorelay ] && port=7721
		out=$(lx "$src" -- iperf3 -c "$(addr gw.site1)" -p $port -n "$bytes" -J)
	fi
	t1=$(date +%s%N) a1=$(usec "$1-site1") b1=$(usec "$1-site2")
	local sent
	sent=$(echo "$out" | awk -F'[:,]' '/"bytes"/ { b = $2 } END { print b }')
	awk -v m="$1" -v a=$((a1 - a0)) -v b=$((b1 - b0)) -v w=$((t1 - t0)) -v n="$sent" \
		'BEGIN { printf "%-7s %.2f s %.1f Mbit/s cpu site1 %.3f s site2 %.3f s, both %.2f s/GiB\n",
			m, w / 1e9, 8 * n / (w / 1e3), a / 1e6, b / 1e6, (a + b) / 1e6 / (n / 2^30) }' | tee -a "$dir/runs"
}
# pingpong MODE SIZE: sockperf ping-pongs of SIZE bytes over one TCP
# connection for PINGSECS seconds, nothing between them (no warm-up
# messages); prints the round trip's median and 99th percentile and the
# relays' CPU and context switches per round trip.
secs=${PINGSECS:-6}
pingpong() {
	local a0 b0 a1 b1 out g=$1
	local sp=(sockperf ping-pong --tcp -m "$2" -t "$secs" --full-rtt --dontwarmup)
	# direct: the idle gateways' CPU meanwhile, for comparison
	[ "$1" = direct ] && g=gw
	csw "$g-site1" "$g-site2" >"$dir/csw0"
	: >"$dir/csw1"
	cswwatch "$g" "$dir/csw1" &
	local wpid=$!
	a0=$(usec "$g-site1") b0=$(usec "$g-site2")
	case $1 in
	direct) out=$(lx "$src" -- "${sp[@]}" -i "$(addr "$dst")" -p "$pport" 2>&1) || true ;;
	gw) out=$(lx "$src" -- env LD_PRELOAD="$shim" MPI5K_MAP="$map" GODEBUG=asyncpreemptoff=1 \
		"${sp[@]}" -i "$(addr "$dst")" -p "$pport" 2>&1) || true ;;
	gorelay) out=$(lx "$src" -- "${sp[@]}" -i "$(addr gw.site1)" -p 7731 2>&1) || true ;;
	socat) out=$(lx "$src" -- "${sp[@]}" -i "$(addr gw.site1)" -p 7711 2>&1) || true ;;
	esac
	a1=$(usec "$g-site1") b1=$(usec "$g-site2")
	kill "$wpid"
	wait "$wpid" 2>/dev/null || true
	csw "$g-site1" "$g-site2" >>"$dir/csw1"
	local cs
	cs=$(cswdelta "$dir/csw0" "$dir/csw1")
	echo "$out" >>"$dir/sockperf.log"
	# sockperf colours some lines; the numbers are read from plain ones.
	local n med p99
	n=$(echo "$out" | sed -n 's/.*\[Total Run\].*ReceivedMessages=\([0-9]*\).*/\1/p')
	med=$(echo "$out" | sed -n 's/.*percentile 50\.000 = *\([0-9.]*\).*/\1/p')
	p99=$(echo "$out" | sed -n 's/.*percentile 99\.000 = *\([0-9.]*\).*/\1/p')
	[ -n "$n" ] && [ "$n" -gt 0 ] && [ -n "$med" ] ||
		{ echo "$1 ping $2 B: sockperf failed:"; echo "$out" | tail -5; return 0; }
	awk -v m="$1" -v s="$2" -v a=$((a1 - a0)) -v b=$((b1 - b0)) -v n="$n" -v med="$med" -v p99="${p99:-nan}" -v cs="$cs" \
		'BEGIN { printf "ping %-7s %5d B: %d round trips, median %.0f us p99 %.0f us", m, s, n, med, p99
			if (m == "direct") printf ", no relay (the idle gateways meanwhile: %.1f us, %.2f context switches per round trip)\n", (a + b) / n, cs / n
			else printf ", cpu per round trip site1 %.1f us site2 %.1f us, both %.1f us, %.2f context switches per round trip\n", a / n, b / n, (a + b) / n, cs / n }' |
		tee -a "$dir/pings"
}
echo "one iperf3 stream of $bytes, site1 -> site2, 20 ms, 200 Mbit/s; then sockperf ping-pongs of $sizes bytes, $secs s each, direct, gw, gorelay and socat; relays' CPU from their cgroups, their context switches from /proc"
for _ in $(seq "$reps"); do
	run gw
	run gorelay
	run socat
	for s in $sizes; do
		for m in direct gw gorelay socat; do pingpong "$m" "$s"; done
	done
done
echo "== min / median over $reps runs: s/GiB of both relays, Mbit/s"
for m in gw gorelay socat; do
	awk -v m=$m '$1 == m { print $(NF - 1), $4 }' "$dir/runs" | sort -n |
		awk -v m=$m '{ c[NR] = $1; r[NR] = $2 } END { printf "%-7s cpu %.2f / %.2f s/GiB\n", m, c[1], c[int((NR + 1) / 2)] }'
done
echo "== min / median over $reps runs: round trip median and p99 (us), both relays' CPU per round trip (us), their context switches per round trip"
touch "$dir/pings"
for s in $sizes; do
	for m in direct gw gorelay socat; do
		# the numbers after "median", "p99", "both" (or "meanwhile:") and
		# before "context"
		awk -v m="$m" -v s="$s" '$1 == "ping" && $2 == m && $3 == s {
				for (i = 4; i <= NF; i++) {
					if ($i == "median") med = $(i + 1)
					if ($i == "p99") p99 = $(i + 1)
					if ($i == "both" || $i == "meanwhile:") cpu = $(i + 1)
					if ($i == "context") cs = $(i - 1)
				}
				print med, p99, cpu, cs }' "$dir/pings" |
			awk -v m="$m" -v s="$s" 'function mm(v, n, f,   i, j, t) {
				for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
				return sprintf(f " / " f, v[1], v[int((n + 1) / 2)]) }
			{ a[NR] = $1; b[NR] = $2; c[NR] = $3; d[NR] = $4 }
			END { if (NR == 0) { printf "%-7s %5d B: no runs\n", m, s; exit }
				printf "%-7s %5d B: median %s us, p99 %s us", m, s, mm(a, NR, "%.0f"), mm(b, NR, "%.0f")
				if (m == "direct") printf ", no relay (idle gateways %s us, %s context switches per round trip)\n", mm(c, NR, "%.0f"), mm(d, NR, "%.2f")
				else printf ", cpu %s us, %s context switches per round trip\n", mm(c, NR, "%.0f"), mm(d, NR, "%.2f") }'
	done
done
