#!/bin/bash
# Sums CPU profiles of the gateway (--cpu-profile) by what the time went
# to: system calls (the kernel's TCP and epoll work, which the profiler
# charges to the call), the Go scheduler parking and waking threads, the
# rest of the runtime, allocation and GC, the relay's own code, crypto, and
# the rest. Several files are summed (e.g. both gateways of one run).
#
# usage: bench/profcat.sh [-b BINARY] PROFILE...   (BINARY: bin/mpi5k-gateway)
set -eu
bin=bin/mpi5k-gateway
if [ "${1:-}" = -b ]; then bin=$2; shift 2; fi
[ $# -gt 0 ] || { echo "usage: bench/profcat.sh [-b BINARY] PROFILE..." >&2; exit 2; }
gocmd=${GO:-/usr/local/go/bin/go}
[ -x "$gocmd" ] || gocmd=go
"$gocmd" tool pprof -top -nodecount=1000000 "$bin" "$@" 2>/dev/null | awk '
/flat%/ { on = 1; next }
on && NF >= 6 {
	v = $1; u = v; sub(/[a-z]+$/, "", v)
	if (u ~ /ms$/) v /= 1000; else if (u ~ /us$/) v /= 1e6
	f = $6; for (i = 7; i <= NF; i++) f = f " " $i
	c = "other"
	if (f ~ /Syscall6|RawSyscall|syscall\.Syscall/) c = "system calls (kernel TCP, epoll)"
	else if (f ~ /fips140|gcm|aes|chacha|poly1305|mlkem|x25519|ecdh|edwards/) c = "crypto"
	else if (f ~ /^runtime\.(futex|usleep|osyield|procyield)/) c = "runtime: threads sleep and wake"
	else if (f ~ /^runtime\.(mallocgc|nextFree|scanObject|gcDrain|greyobject|findObject|heapBits|memclr|sweep|markBits|spanOf|wbBuf|bulkBarrier)/) c = "runtime: allocation and GC"
	else if (f ~ /^runtime\.memmove/) c = "copies (memmove)"
	else if (f ~ /^runtime\./) c = "runtime: scheduler and the rest"
	else if (f ~ /mpi5k\/(relay|header|seal)/) c = "relay, header, seal"
	else if (f ~ /mpi5k\/(gateway|tuning|tcpinfo)/) c = "gateway, tuning, tcpinfo"
	t[c] += v; tot += v
}
END {
	for (c in t) printf "%7.2f s %5.1f %%  %s\n", t[c], 100 * t[c] / tot, c
	printf "%7.2f s          total\n", tot
}' | sort -rn
