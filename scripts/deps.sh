#!/bin/sh
# Installs what mpi5k needs on Debian 12. Idempotent: apt runs only when a
# package is missing, so `make test` can call it every time.
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
go mod download
