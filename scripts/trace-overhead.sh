#!/bin/bash
# Trace overhead on a whole MPI run (docs/tracing.md, "Overhead"): the same
# Open MPI workload through `mpi5k run` on a private lab, alternating
#   off    - no trace
#   trace  - --trace, MPI5K_TRACE_SAMPLE=off (socket calls only)
#   sample - --trace, TCP_INFO sampling every 100 ms (the default)
# and printing one line per run, then min and median per mode.
# MODES="trace sample" runs a subset. Root only (the lab needs namespaces).
# Usage, from the repository root after `make` and `make bench-bin`:
#   scripts/trace-overhead.sh [REPS] [WORKLOAD] [workload args...]
#   scripts/trace-overhead.sh 6 cg --scale 0.3 --compute-scale 0.1
set -eu
REPS=${1:-6}
WL=${2:-cg}
shift 2 2>/dev/null || shift $#
ARGS=${*:-"--scale 0.3 --compute-scale 0.1"}
ROOT=$(pwd)
BIN=$ROOT/bin/mpi5k
W=$ROOT/bin/bench/openmpi/mpi5k-workload
[ -x "$BIN" ] && [ -x "$W" ] || { echo "run make and make bench-bin first ($BIN, $W)" >&2; exit 2; }
LAB=trov$$
TMP=$(mktemp -d)
trap '"$BIN" lab down --name $LAB >/dev/null 2>&1; rm -rf "$TMP"' EXIT
"$BIN" lab up --name $LAB --nodes 2 --rtt 2ms --wan-rate 1gbit >/dev/null
printf '10.77.1.0/24 site1\n10.77.2.0/24 site2\n' >"$TMP/sites"
HOSTS=node-1.site1,node-2.site1,node-1.site2,node-2.site2
for i in $(seq 1 "$REPS"); do
	for mode in ${MODES:-off trace sample}; do
		rm -rf "$TMP/tr"
		mkdir -p "$TMP/tr"
		tr="" env=""
		[ $mode = trace ] && tr="--trace $TMP/tr" env="MPI5K_TRACE_SAMPLE=off"
		[ $mode = sample ] && tr="--trace $TMP/tr" env="MPI5K_TRACE_SAMPLE=100ms"
		# shellcheck disable=SC2086
		out=$("$BIN" lab exec --name $LAB node-1.site1 -- env $env "$BIN" run --sites "$TMP/sites" $tr \
			mpirun.openmpi --allow-run-as-root --mca pml ob1 --mca btl tcp,self --mca mpi_yield_when_idle 1 \
			--mca btl_tcp_if_include 10.77.0.0/16 --mca oob_tcp_if_include 10.77.0.0/16 -np 4 -H $HOSTS \
			"$W" --workload "$WL" $ARGS --loops-per-us 100 2>&1) || true
		t=$(echo "$out" | grep -o 'time_s=[0-9.]*' | cut -d= -f2)
		recs=0
		if [ $mode != off ]; then
			n=$(ls "$TMP/tr" | wc -l)
			recs=$((($(cat "$TMP"/tr/*.trace | wc -c) - 128 * n) / 64))
		fi
		echo "$WL $mode rep=$i time_s=${t:-FAILED} records=$recs"
	done
done | tee "$TMP/runs"
for mode in ${MODES:-off trace sample}; do
	grep " $mode " "$TMP/runs" | grep -o 'time_s=[0-9.]*' | cut -d= -f2 | sort -n |
		awk -v m=$mode '{v[NR]=$1} END {if (NR) printf "%-6s n=%d min=%.3f median=%.3f\n", m, NR, v[1], (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'
done
