#!/bin/bash
# ss -tin of both gateways' WAN sockets every 0.2 s while crossping runs 56 KiB ping-pongs.
out=$1
mkdir -p $out
( while :; do
	for s in site1 site2; do
		echo "T $(date +%s.%N) $s"
		nsenter --net=/run/mpi5k/jm1/netns/jm1-gw.$s ss -tinH state established '( sport = :5001 or dport = :5001 )'
	done
	sleep 0.2
  done ) > $out/ss.txt 2>&1 &
sp=$!
SIZES=57344 MODES="bbrx=--wan-express-cc bbr" /work/wt-cross/bench/crossping.sh jm1 $out/ping 1 300
kill $sp
