# bash completion for mpi5k, mpi5k-gateway and mpirun-wrap. The words come
# from the commands' own --help at completion time, so they are always
# those of the installed binaries.

# _mpi5k_flags CMD...: the long flags CMD --help (and --help-advanced)
# lists.
_mpi5k_flags() {
	{ "$@" --help; "$@" --help-advanced; } 2>/dev/null |
		grep -oE -- '(^|[[:space:][])--[a-z][a-z0-9-]*' | sed 's/^[[:space:][]*//' | sort -u
}

# _mpi5k_subs CMD...: the commands CMD --help lists.
_mpi5k_subs() {
	"$@" --help 2>/dev/null | awk -v c="$*" '
		/^commands:/ { on = 1; next } on && /^  [a-z]/ { print $1; next } on && /^$/ { on = 0 }
		/^  [a-z]+ / && c != "mpi5k" { print $1 }
		/^[a-z]+  / { print $1 }
		c != "mpi5k" { n = split(c, w, " "); for (i = 1; i + n <= NF; i++) { m = 1; for (j = 1; j <= n; j++) if ($(i + j - 1) != w[j]) m = 0; if (m && $(i + n) ~ /^[a-z]+$/) print $(i + n) } }' |
		sort -u
}

_mpi5k() {
	local cur=${COMP_WORDS[COMP_CWORD]} prog=${COMP_WORDS[0]} i w
	local -a cmd=("$prog")
	# The command words so far: mpi5k [COMMAND [SUBCOMMAND]]; mpi5k run
	# and mpirun-wrap end at the launcher word, after which the launcher's
	# own arguments follow.
	for ((i = 1; i < COMP_CWORD; i++)); do
		w=${COMP_WORDS[i]}
		if [[ $w != -* ]]; then
			if [[ $prog == *mpi5k && ${#cmd[@]} -lt 3 && ${cmd[1]:-} != run ]] &&
				_mpi5k_subs "${cmd[@]}" | grep -qxF -- "$w"; then
				cmd+=("$w")
				continue
			fi
			if [[ ${cmd[1]:-} == run || $prog == *mpirun-wrap ]] && [[ ${COMP_WORDS[i - 1]} != --* || ${COMP_WORDS[i - 1]} == *=* ]]; then
				COMPREPLY=($(compgen -f -- "$cur"))
				return
			fi
		fi
	done
	if [[ $cur == -* ]]; then
		COMPREPLY=($(compgen -W "$(_mpi5k_flags "${cmd[@]}")" -- "$cur"))
	elif [[ $prog == *mpi5k && ${#cmd[@]} -lt 3 ]]; then
		COMPREPLY=($(compgen -W "$(_mpi5k_subs "${cmd[@]}")" -- "$cur"))
		[[ ${#COMPREPLY[@]} -gt 0 ]] || COMPREPLY=($(compgen -f -- "$cur"))
	else
		COMPREPLY=($(compgen -f -- "$cur"))
	fi
}
complete -F _mpi5k mpi5k mpi5k-gateway mpirun-wrap
