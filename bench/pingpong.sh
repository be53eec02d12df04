#!/bin/bash
# Figure (a) of issue 4: 1-byte ping-pong round trip on loopback, direct vs
# through the gateway pair vs through a chain of two socat relays (and two
# minimal Go forwarders), each row side by side in one run, repeated.
#
# On a VM the cost of a relay running as its own process is dominated by how
# fast an idle vCPU wakes up. Debian's cloud kernels poll before halting an
# idle vCPU (cpuidle-haltpoll, guest_halt_poll_ns, kernel default 200 us);
# this project's VM ships with it set to 0, so every hop pays a VM exit. The
# script measures as the machine is and, when it can (root, haltpoll
# loaded), once more with the kernel's default polling, then restores the
# value it found. A last pass holds /dev/cpu_dma_latency at 0, so idle vCPUs
# poll and never halt: what is left then is each hop's own work (a loopback
# TCP traversal, a wake-up on a running vCPU), not the cost of waking a
# halted one.
#
# usage: bench/pingpong.sh [REPEATS]   (default 3; run after `make`)
#        MPI5K_ECHO=proc bench/pingpong.sh   the echo server in a process of its
#        own, as a remote rank is (default: in the benchmark's process)
#        MPI5K_RAWCLIENT=1 ...   the client waits in a blocking read(2) on a
#        socket the Go runtime does not watch, as a C rank does (default: Go's
#        network poller)
set -eu
cd "$(dirname "$0")/.."
reps=${1:-3}
GO=${GO:-go}
bin=$(mktemp)
trap 'rm -f "$bin" "$bin".*' EXIT
$GO test -c -o "$bin" ./gateway

# run LABEL: REPS runs of the benchmark; prints one line per row with the
# min and median of the p50 round trip over the runs.
run() {
	local label=$1 out=$bin.$RANDOM
	for _ in $(seq "$reps"); do
		(cd gateway && "$bin" -test.run '^$' -test.bench 'PingPong' -test.benchtime 20000x 2>/dev/null) |
			awk '/^BenchmarkPingPong\//{ sub(/-[0-9]+$/, "", $1); sub(/^BenchmarkPingPong\//, "", $1); for (i = 2; i <= NF; i++) if ($(i+1) == "p50-us") print $1, $i }' >>"$out"
	done
	echo "== $label: p50 round trip in us over $reps runs (min / median)"
	sort -k1,1 -k2,2n "$out" | awk '
		{ v[$1] = v[$1] " " $2; n[$1]++ }
		END { for (k in v) { split(substr(v[k], 2), a, " "); printf "  %-26s %7.1f / %7.1f\n", k, a[1], a[int((n[k] + 1) / 2)] } }' | sort -k2,2n
}

knob=/sys/module/haltpoll/parameters/guest_halt_poll_ns
run "machine as configured ($( [ -r $knob ] && echo "guest_halt_poll_ns=$(cat $knob)" || echo "no cpuidle-haltpoll"))"
if [ -w "$knob" ] && [ "$(cat $knob)" = 0 ]; then
	old=$(cat $knob)
	trap 'echo "$old" >'"$knob"'; rm -f "$bin" "$bin".*' EXIT
	echo 200000 >"$knob"
	run "guest_halt_poll_ns=200000 (the kernel's default)"
	echo "$old" >"$knob"
fi
if [ -w /dev/cpu_dma_latency ]; then
	# The request lasts as long as the file stays open.
	exec 9>/dev/cpu_dma_latency
	printf 0 >&9
	run "cpu_dma_latency held at 0 (idle vCPUs poll, never halt)"
	exec 9>&-
fi
