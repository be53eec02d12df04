package wrap

import (
	"path/filepath"
	"strings"
)

// With --launcher oarsh the gateways start through oarsh, and so must the
// MPI launcher's own daemons: on Grid'5000 plain ssh does not reach the
// nodes of an OAR job. A launcher line that says how it starts its
// daemons is left alone, as is a flavour with no option for it (its
// agentOptions).
func withOarsh(f Flavour, argv []string, launcher []string, getenv func(string) string) ([]string, string) {
	if len(launcher) == 0 || filepath.Base(launcher[0]) != "oarsh" || len(argv) == 0 {
		return argv, ""
	}
	opts, _ := scanArgs(f, argv)
	extra := f.agentOptions(strings.Join(launcher, " "), opts, getenv)
	if extra == nil {
		return argv, ""
	}
	return afterLauncher(argv, extra...), strings.Join(extra, " ")
}

// agentGiven reports whether opts say how the launcher starts its
// daemons: one of names, or an --mca *rsh_agent.
func agentGiven(opts []argOption, names ...string) bool {
	for _, o := range opts {
		for _, n := range names {
			if o.Name == n {
				return true
			}
		}
		if (o.Name == "--mca" || o.Name == "-mca") && len(o.Values) > 0 && strings.HasSuffix(o.Values[0], "rsh_agent") {
			return true
		}
	}
	return false
}
