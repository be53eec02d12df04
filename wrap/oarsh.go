package wrap

import (
	"path/filepath"
	"strings"
)

// With --launcher oarsh the gateways start through oarsh, and so must the
// MPI launcher's own daemons: on Grid'5000 plain ssh does not reach the
// nodes of an OAR job. A launcher line that says how it starts its
// daemons is left alone. (PRRTE, Open MPI 5, is not handled: how it starts
// its daemons is set with --prtemca, which the user gives.)
func withOarsh(f Flavour, argv []string, launcher []string, getenv func(string) string) ([]string, string) {
	if len(launcher) == 0 || filepath.Base(launcher[0]) != "oarsh" || len(argv) == 0 {
		return argv, ""
	}
	via := strings.Join(launcher, " ")
	opts, _ := scanArgs(f, argv)
	set := func(names ...string) bool {
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
	var extra []string
	switch f {
	case OpenMPI:
		if set() || getenv("OMPI_MCA_plm_rsh_agent") != "" || getenv("OMPI_MCA_orte_rsh_agent") != "" {
			return argv, ""
		}
		extra = []string{"--mca", "plm_rsh_agent", via}
	case Hydra, IntelMPI:
		if set("-launcher", "-launcher-exec", "-bootstrap", "-bootstrap-exec") || getenv("HYDRA_LAUNCHER_EXEC") != "" || getenv("I_MPI_HYDRA_BOOTSTRAP_EXEC") != "" {
			return argv, ""
		}
		extra = []string{"-launcher", "ssh", "-launcher-exec", via}
	default:
		return argv, ""
	}
	out := append(append([]string{argv[0]}, extra...), argv[1:]...)
	return out, strings.Join(extra, " ")
}
