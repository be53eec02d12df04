# Sourced, not run: what the bench scripts that start the gateways on a lab
# by hand share (crossping.sh, crossshare.sh, relayfloor.sh). The caller
# sets mpi5k and gw (the binaries), lab (the lab's name), map (its site
# map), out (a directory for the gateways' ready files and logs) and allow
# (the ports the gateways' --wan-allow-ports opens).

# addr HOST: the lab host's address.
addr() { awk -v h="$1" '$2 == h { print $1; exit }' "/run/mpi5k/$lab/hosts"; }
# lx HOST -- CMD...: CMD in the lab host's namespace.
lx() { "$mpi5k" lab exec --name "$lab" "$@"; }

pids=() gwpids=() execpids=()
# startgw FLAGS...: the two gateways in the gw.* hosts; waits for both and
# records their pids (in site order) in gwpids.
startgw() {
	local site
	for site in site1 site2; do
		rm -f "$out/$site.ready"
		lx "gw.$site" -- "$gw" --map "$map" --site "$site" --ready-file "$out/$site.ready" \
			--wan-allow-ports "$allow" --log-level warn "$@" 2>>"$out/gw-$site.log" &
		execpids+=($!)
	done
	for site in site1 site2; do
		for _ in $(seq 300); do [ -e "$out/$site.ready" ] && break; sleep 0.1; done
		[ -e "$out/$site.ready" ] || { echo "gateway $site not ready:"; cat "$out/gw-$site.log"; exit 1; }
		gwpids+=("$(awk '{ print $3 }' "$out/$site.ready")")
	done
	sleep 1
}
# stopgw: ends the gateways (their pids from the ready files) and the lab
# exec processes that started them, and waits until they are gone.
stopgw() {
	for p in "${gwpids[@]}" "${execpids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${execpids[@]}"; do wait "$p" 2>/dev/null || true; done
	for p in "${gwpids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
	gwpids=() execpids=()
}
# cleanup: the gateways, the caller's pids and the lab's competing flows.
cleanup() {
	stopgw
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	"$mpi5k" lab cross --name "$lab" --stop >/dev/null 2>&1 || true
}
