#!/bin/bash
# The CPU a site pair's relays take per GiB carried over the lab's emulated
# WAN (20 ms RTT, 200 Mbit/s): the gateways against the simplest relays that
# do the same hop, two socat processes (node -> socat on gw.site1 -> WAN ->
# socat on gw.site2 -> node), with the same bulk transfer (iperf3, one TCP
# stream, BYTES) through each in turn, REPEATS times, alternating. Each
# relay runs in a cgroup of its own, so its CPU (user + system, cpu.stat)
# counts every thread and socat's forked children. A ratio of the two is
# what the gateways add over a plain user-space copy at each hop; the rest
# is what any split-TCP relay costs on this machine (issue 36).
#
# usage: flock /tmp/mpi5k-heavy.lock bench/relayfloor.sh [BYTES] [REPEATS]
#        (root; run `make` first; GWARGS="..." adds gateway flags)
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
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	"$mpi5k" lab down --name "$name" >/dev/null 2>&1 || true
	for g in "$cg"/*/; do [ -d "$g" ] && rmdir "$g" 2>/dev/null; done
	rmdir "$cg" 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT
command -v socat >/dev/null && command -v iperf3 >/dev/null || { echo "needs socat and iperf3 (make deps)"; exit 1; }

"$mpi5k" lab up --name "$name" --nodes 1 --rtt 20ms --wan-rate 200mbit >"$dir/up.log" 2>&1 ||
	{ cat "$dir/up.log"; exit 1; }
map=/run/mpi5k/$name/sites.conf
addr() { awk -v h="$1" '$2 == h { print $1; exit }' "/run/mpi5k/$name/hosts"; }
src=$("$mpi5k" lab hosts --name "$name" --site site1 | head -1)
dst=$("$mpi5k" lab hosts --name "$name" --site site2 | head -1)
lx() { "$mpi5k" lab exec --name "$name" "$@"; }

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
lx "$dst" -- "$mpi5k" bench _tcpping --listen "$(addr "$dst"):7600" >/dev/null 2>&1 &
pids+=($!)
for site in site1 site2; do
	# shellcheck disable=SC2086
	lx "gw.$site" -- "$gw" --map "$map" --site "$site" --ready-file "$dir/$site.ready" \
		--wan-allow-ports 5201,7600 --log-level warn ${GWARGS:-} 2>"$dir/$site.log" &
	pids+=($!)
done
for site in site1 site2; do
	for _ in $(seq 300); do [ -e "$dir/$site.ready" ] && break; sleep 0.1; done
	[ -e "$dir/$site.ready" ] || { echo "gateway $site not ready:"; cat "$dir/$site.log"; exit 1; }
	into "gw-$site" "$(awk '{print $3}' "$dir/$site.ready")"
done
# Two chains: 7701 -> 7702 -> iperf3, 7711 -> 7712 -> the ping-pong's echo.
for c in "7701 7702 5201" "7711 7712 7600"; do
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
sleep 2 # gateways primed

# run MODE: one transfer; prints seconds, Mbit/s and each relay's CPU.
run() {
	local a0 b0 a1 b1 t0 t1 out
	a0=$(usec "$1-site1") b0=$(usec "$1-site2") t0=$(date +%s%N)
	if [ "$1" = gw ]; then
		out=$(lx "$src" -- env LD_PRELOAD="$shim" MPI5K_MAP="$map" GODEBUG=asyncpreemptoff=1 \
			iperf3 -c "$(addr "$dst")" -p 5201 -n "$bytes" -J)
	else
		out=$(lx "$src" -- iperf3 -c "$(addr gw.site1)" -p 7701 -n "$bytes" -J)
	fi
	t1=$(date +%s%N) a1=$(usec "$1-site1") b1=$(usec "$1-site2")
	local sent
	sent=$(echo "$out" | awk -F'[:,]' '/"bytes"/ { b = $2 } END { print b }')
	awk -v m="$1" -v a=$((a1 - a0)) -v b=$((b1 - b0)) -v w=$((t1 - t0)) -v n="$sent" \
		'BEGIN { printf "%-5s %.2f s %.1f Mbit/s cpu site1 %.3f s site2 %.3f s, both %.2f s/GiB\n",
			m, w / 1e9, 8 * n / (w / 1e3), a / 1e6, b / 1e6, (a + b) / 1e6 / (n / 2^30) }' | tee -a "$dir/runs"
}
# pingpong MODE: PINGS round trips of 1 KiB messages (LU's size) with nothing
# between them; prints the relays' CPU per round trip.
pings=${PINGS:-300}
pingpong() {
	local a0 b0 a1 b1 out
	a0=$(usec "$1-site1") b0=$(usec "$1-site2")
	if [ "$1" = gw ]; then
		out=$(lx "$src" -- env LD_PRELOAD="$shim" MPI5K_MAP="$map" GODEBUG=asyncpreemptoff=1 \
			"$mpi5k" bench _tcpping --connect "$(addr "$dst"):7600" --min-size 1024 --max-size 1024 --reps "$pings")
	else
		out=$(lx "$src" -- "$mpi5k" bench _tcpping --connect "$(addr gw.site1):7711" --min-size 1024 --max-size 1024 --reps "$pings")
	fi
	a1=$(usec "$1-site1") b1=$(usec "$1-site2")
	local med
	med=$(echo "$out" | sed -n 's/.*lat_us_med=\([0-9.]*\).*/\1/p')
	awk -v m="$1" -v a=$((a1 - a0)) -v b=$((b1 - b0)) -v n="$pings" -v med="$med" \
		'BEGIN { printf "%-5s ping 1 KiB: half round trip median %.0f us, cpu per round trip site1 %.1f us site2 %.1f us, both %.1f us\n",
			m, med, a / n, b / n, (a + b) / n }' | tee -a "$dir/pings"
}
echo "one iperf3 stream of $bytes, site1 -> site2, 20 ms, 200 Mbit/s; then $pings 1 KiB round trips; relays' CPU from their cgroups"
for _ in $(seq "$reps"); do
	run gw
	run socat
	pingpong gw
	pingpong socat
done
echo "== min / median over $reps runs: s/GiB of both relays, Mbit/s"
for m in gw socat; do
	awk -v m=$m '$1 == m { print $(NF - 1), $4 }' "$dir/runs" | sort -n |
		awk -v m=$m '{ c[NR] = $1; r[NR] = $2 } END { printf "%-5s cpu %.2f / %.2f s/GiB\n", m, c[1], c[int((NR + 1) / 2)] }'
done
for m in gw socat; do
	awk -v m=$m '$1 == m { print $NF == "us" ? $(NF - 1) : $NF }' "$dir/pings" | sort -n |
		awk -v m=$m '{ c[NR] = $1 } END { printf "%-5s cpu %.1f / %.1f us per 1 KiB round trip\n", m, c[1], c[int((NR + 1) / 2)] }'
done
