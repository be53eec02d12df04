#!/bin/bash
# WAN resume on the lab (20 ms RTT, 200 Mbit/s): the pause a ping-pong sees
# when both WAN connections are killed (ss -K), the bulk throughput lost
# per kill, and the replay lists' memory (e2e TestResumeFigures).
#
# usage: bench/resume.sh [REPEATS]   (root; run `make` first)
set -eu
cd "$(dirname "$0")/.."
MPI5K_RESUME_FIGURES=1 MPI5K_RESUME_REPEATS=${1:-3} \
	go test -count=1 -p 1 -timeout 20m -run '^TestResumeFigures$' -v ./e2e 2>&1 |
	grep -v '^time='
