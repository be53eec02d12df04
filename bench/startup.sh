#!/bin/bash
# A job's start-up through the gateways against direct (issue 50): the
# startup workload (launch to MPI_Init and a first Alltoall done, see
# bench/README.md) on labs of 2 and of 8 sites, CUBIC hosts, RTT 20 ms,
# 200 Mbit/s, with each MPI flavour; modes alternate, REPS repetitions:
# direct, through per-job gateways launched once primed (the default), and
# launched once their links are up (--start-when links: early), and
# without priming (--wan-prime=false: noprime, what priming costs).
# 2 sites x 2 nodes run 4 ranks, 8 sites x 1 node 8 ranks. Each lab is
# brought up, measured and taken down in turn.
#
# usage: bench/startup.sh OUTDIR [REPS] [FLAVOURS] [SITES]
#        (root; run `make` first; e.g. bench/startup.sh /tmp/su 5 "openmpi mpich" "2 8")
set -eu
cd "$(dirname "$0")/.."
out=$1
reps=${2:-5}
flavours=${3:-openmpi mpich}
sitecounts=${4:-2 8}
mpi5k=$PWD/bin/mpi5k
mkdir -p "$out"
lab=""
cleanup() { [ -z "$lab" ] || "$mpi5k" lab down --name "$lab" >/dev/null 2>&1 || true; }
trap cleanup EXIT
for n in $sitecounts; do
	nodes=2
	[ "$n" -le 2 ] || nodes=1
	lab=su$n-$$
	"$mpi5k" lab up --name "$lab" --sites "$n" --nodes "$nodes" --rtt 20ms --wan-rate 200mbit \
		--host-cc cubic >"$out/lab-$n.log" 2>&1
	for f in $flavours; do
		"$mpi5k" bench --lab "$lab" --flavour "$f" --workloads startup --modes direct,gateways \
			--gw-mode early='--start-when links' --gw-mode noprime='--wan-prime=false' \
			--cross none --reps "$reps" --out "$out/sites$n-$f" | tee "$out/sites$n-$f.txt"
	done
	"$mpi5k" lab down --name "$lab" >/dev/null
	lab=""
done
