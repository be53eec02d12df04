#!/bin/bash
# Runs the end-to-end suite (root, labs). On this project's 2-core VMs the
# kernel can starve the lab's WAN emulator for seconds to minutes while MPI
# ranks spin in sched_yield (an EEVDF bug fixed upstream in 2026, see
# testbed/README.md "Known problems"). A test that failed while its lab
# recorded such a stall is run once more. Only when every failed test is
# one of those: any other failure fails the suite as it is.
set -u
GO=${GO:-go}
cd "$(dirname "$0")/.."
stalled=$(mktemp)
log=$(mktemp)
trap 'rm -f "$stalled" "$log"' EXIT

MPI5K_E2E_STALLED=$stalled $GO test -count=1 -timeout 40m -p 1 ./e2e/... 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] && exit 0

failed=$(sed -n 's/^--- FAIL: \(Test[A-Za-z0-9_]*\) .*/\1/p' "$log" | sort -u)
[ -n "$failed" ] || exit "$rc"
for t in $failed; do
	if ! grep -q "^$t " "$stalled"; then
		echo "e2e: $t failed without a lab stall: not retried"
		exit "$rc"
	fi
done
echo "e2e: every failed test ran on a lab whose emulator the machine starved:"
sed 's/^\(Test[^ ]*\) \([0-9]*\)$/  \1: \2 packets left the emulator 1 s or more late/' "$stalled"
echo "e2e: running them once more"
pattern="^($(echo $failed | tr ' ' '|'))\$"
: > "$stalled"
MPI5K_E2E_STALLED=$stalled $GO test -count=1 -timeout 40m -p 1 -run "$pattern" ./e2e/...
