#!/bin/sh
# Writes the man pages of mpi5k, of each of its commands, of mpi5k-gateway
# and of mpirun-wrap into OUTDIR. help2man makes each from the command's own
# --help, which pflag prints from the flags as they are declared, so a page
# cannot drift from its binary: make test compares them (dist/dist_test.go).
#
# usage: scripts/manpages.sh BINDIR OUTDIR VERSION INSTALLED_BINDIR
set -eu
bin=$(cd "$1" && pwd) out=$2 version=$3 installed=$4
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Defaults that name this build's directory name the installed one.
esc() { printf '%s' "$1" | sed -e 's/[][\.*^$|]/\\&/g' -e 's/-/\\\\-/g'; }
from=$(esc "$bin") to=$(printf '%s' "$installed" | sed 's/-/\\\\-/g')

# page NAME TITLE DESCRIPTION COMMAND... [-- INCLUDE]: one page.
page() {
	name=$1 title=$2 what=$3
	shift 3
	inc=$tmp/$name.h2m
	cat "$tmp/common.h2m" >"$inc"
	[ ! -s "$tmp/extra" ] || cat "$tmp/extra" >>"$inc"
	help2man --no-info --no-discard-stderr --version-string="$version" \
		--include="$inc" --name="$what" "$*" >"$tmp/$name.1"
	# The title and the NAME line name the page (mpi5k-run, not mpi5k run):
	# whatis and apropos read them.
	sed -e "s|$from|$to|g" -e "1,3s|^\.TH [^ ]* \"1\"|.TH $title \"1\"|" \
		-e "/^\.SH NAME/{n;s|^.* \\\\- |$(echo "$name" | sed 's/-/\\\\-/g') \\\\- |;}" "$tmp/$name.1" >"$out/$name.1"
	: >"$tmp/extra"
}

# verbatim SECTION TEXT-FILE: an include section that keeps its layout.
verbatim() {
	{ printf '[%s]\n.nf\n' "$1"; sed -e 's/\\/\\e/g' -e 's/^\./\\\&./' -e 's/-/\\-/g' "$2"; printf '.fi\n'; } >>"$tmp/extra"
}

cat >"$tmp/common.h2m" <<'H2M'
[SEE ALSO]
.BR mpi5k (1),
.BR mpi5k-run (1),
.BR mpi5k-gateway (1);
/usr/share/doc/mpi5k/README.md and /usr/share/doc/mpi5k/operations.md.
H2M
: >"$tmp/extra"

"$bin/mpi5k-gateway" --help-advanced >"$tmp/adv"
verbatim "ADVANCED FLAGS" "$tmp/adv"
page mpi5k-gateway MPI5K-GATEWAY "site gateway: relays a site's inter-site MPI connections over the WAN" "$bin/mpi5k-gateway"

page mpi5k MPI5K "run MPI jobs across sites through per-site gateways" "$bin/mpi5k"

# One page a command, named by mpi5k --help's list.
"$bin/mpi5k" --help | awk '/^commands:/ { on = 1; next } on && /^  [a-z]/ { print } on && /^$/ { exit }' >"$tmp/cmds"
while read -r cmd what; do
	[ "$cmd" != version ] || continue
	# Commands with commands of their own (lab up, trace report, ...):
	# each one's flags in a section of its own.
	"$bin/mpi5k" "$cmd" --help 2>&1 | awk -v c="$cmd" '
		/^  [a-z]+ / { print $1 }
		/^[a-z]+  / { print $1 }
		{ for (i = 1; i < NF; i++) if ($i == "mpi5k" && $(i + 1) == c && $(i + 2) ~ /^[a-z]+$/) print $(i + 2) }' |
		awk '!seen[$0]++' >"$tmp/subs" || true
	while read -r sub; do
		if "$bin/mpi5k" "$cmd" "$sub" --help >"$tmp/sub" 2>&1 && grep -q -- '^ *-' "$tmp/sub"; then
			awk '/^(flags|  *-)/ { on = 1 } on' "$tmp/sub" >"$tmp/subflags"
			[ ! -s "$tmp/subflags" ] || verbatim "$(echo "mpi5k $cmd $sub" | tr a-z A-Z) FLAGS" "$tmp/subflags"
		fi
	done <"$tmp/subs"
	if [ "$cmd" = run ]; then
		"$bin/mpi5k" run --help-advanced >"$tmp/adv"
		verbatim "ADVANCED GATEWAY FLAGS" "$tmp/adv"
	fi
	page "mpi5k-$cmd" "$(echo "mpi5k-$cmd" | tr a-z A-Z)" "$what" "$bin/mpi5k" "$cmd"
done <"$tmp/cmds"
# scripts/mpirun-wrap is mpi5k run.
printf '.so man1/mpi5k-run.1\n' >"$out/mpirun-wrap.1"
