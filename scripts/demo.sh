#!/bin/sh
# The README's main command (`make demo`): the NAS-like workloads run
# directly and through the gateways on an idle WAN, a lossy one (0.1 %) and
# a shared one (a CUBIC flow each way), each on an emulated two-site grid
# of its own that it brings up and tears down; prints one table with a
# column group per condition and the figure's path. Exits non-zero when a
# run failed.
set -eu
cd "$(dirname "$0")/.."
exec bin/mpi5k bench --demo "$@"
