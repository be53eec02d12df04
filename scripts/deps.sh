#!/bin/sh
# Installs what mpi5k needs on Debian 12. Idempotent: apt runs only when a
# package is missing, so `make test` can call it every time. The packages:
# the C toolchain (the shim), Open MPI and MPICH (the tests' real jobs),
# iproute2, nftables, iperf3, socat, sockperf (the lab and its traffic),
# graphviz (trace graphs), tshark (capture checks), systemd, lintian,
# help2man (the unit, the package and its man pages), prometheus (promtool
# checks the rules), zsh (its completion is checked).
set -eu
PKGS="build-essential pkg-config git iproute2 procps psmisc kmod
openmpi-bin libopenmpi-dev mpich libmpich-dev gfortran
iperf3 socat sockperf graphviz tshark nftables
systemd lintian prometheus help2man zsh"
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "deps: installing:$missing"
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	$SUDO apt-get update -qq
	# tshark asks whether non-root users may capture; answer no.
	echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
cd "$(dirname "$0")/.."
# Go itself is not a Debian 12 package of the version go.mod names (its
# golang-go is 1.19): say what to do rather than fail inside the build.
want=$(sed -n 's/^go //p' go.mod)
if ! command -v go >/dev/null 2>&1; then
	echo "deps: no go on PATH: mpi5k needs Go $want (go.mod). Unpack the Go project's go$want" \
		"release for linux into /usr/local/go and add /usr/local/go/bin to PATH (Debian 12's golang-go is 1.19, too old)" >&2
	exit 1
fi
have=$(go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1)" != "$want" ]; then
	echo "deps: go $have on PATH, but mpi5k needs Go $want (go.mod): install go$want into /usr/local/go," \
		"or, with Go 1.21 or newer, GOTOOLCHAIN=go$want fetches it through the module proxy" >&2
	exit 1
fi
go mod download
