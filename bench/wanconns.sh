#!/bin/bash
# Counts the TCP connections that cross a lab's WAN while a command runs:
# samples `ss -tin` in every node and gateway namespace of the first site
# every INTERVAL seconds, keeps each connection's largest byte counters, and
# prints, per connection to another site, the bytes it carried each way
# (issue 36: how many shares of the WAN bottleneck a job's traffic holds
# against a competing flow).
#
# usage: bench/wanconns.sh LAB OUT -- COMMAND ARGS...
#        (root; OUT gets the raw samples, OUT.conns the per-connection table)
# Environment: INTERVAL (default 0.5), SITE (default site1).
set -eu
lab=$1 out=$2
shift 2
[ "${1:-}" = -- ] && shift
site=${SITE:-site1}
ns=/run/mpi5k/$lab/netns
hosts=$(ls "$ns" | sed -n "s/^$lab-\(.*\.$site\)$/\1/p" | grep -v '^x-')
: >"$out"
(
	while :; do
		t=$(date +%s.%N)
		for h in $hosts; do
			nsenter --net="$ns/$lab-$h" ss -tinH 2>/dev/null |
				awk -v t="$t" -v h="$h" 'NR % 2 == 1 { st = $1; l = $4; p = $5; next }
					{ a = 0; r = 0
					  for (i = 1; i <= NF; i++) {
						if ($i ~ /^bytes_acked:/) { split($i, x, ":"); a = x[2] }
						if ($i ~ /^bytes_received:/) { split($i, x, ":"); r = x[2] }
					  }
					  print t, h, st, l, p, a, r }'
		done >>"$out"
		sleep "${INTERVAL:-0.5}"
	done
) &
sampler=$!
rc=0
"$@" || rc=$?
kill "$sampler" 2>/dev/null || true
wait "$sampler" 2>/dev/null || true
# Connections to another site's addresses (10.77.<other site>.*): the last
# three columns are the largest bytes sent (acked) and received seen.
mine=$(awk '{ print $4; exit }' "$out" | cut -d. -f1-3)
awk -v mine="$mine" '{ split($5, p, ":"); split(p[1], q, "."); net = q[1] "." q[2] "." q[3]
		if (net == mine || $5 ~ /^127\./) next
		k = $2 " " $4 " " $5
		if ($6 > a[k]) a[k] = $6
		if ($7 > r[k]) r[k] = $7 }
	END { for (k in a) printf "%-14s %-22s %-22s %14d %14d\n", substr(k, 1, index(k, " ") - 1),
			substr(k, index(k, " ") + 1, index(substr(k, index(k, " ") + 1), " ") - 1),
			substr(k, index(k, " ") + 1 + index(substr(k, index(k, " ") + 1), " ")), a[k], r[k] }' "$out" |
	sort >"$out.conns"
echo "host local peer bytes_sent bytes_received (connections leaving $site, largest counters seen)"
cat "$out.conns"
awk '{ n++; if ($4 + $5 > 1048576) m++ } END { printf "%d connections to other sites, %d carried more than 1 MiB\n", n, m }' "$out.conns"
exit $rc
