#!/bin/sh
# The README's main command (`make demo`): brings up an emulated two-site
# grid, runs the ping-pong and a short pattern set directly and through the
# gateways, prints the comparison and the figures' paths, tears the lab down.
set -eu
cd "$(dirname "$0")/.."
exec bin/mpi5k bench --demo "$@"
