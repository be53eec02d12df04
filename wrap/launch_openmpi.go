package wrap

import "fmt"

// Open MPI's launchers: orterun (mpirun.openmpi; ORTE, Open MPI <= 4) and
// prterun (PRRTE, Open MPI 5). Both take -x NAME=VALUE for the ranks'
// environment and hostfiles of "host slots=N" lines.
type openMPI struct{ prrte bool }

var (
	OpenMPI Flavour = openMPI{}            // orterun / mpirun.openmpi (ORTE, Open MPI <= 4)
	PRRTE   Flavour = openMPI{prrte: true} // prterun / prun (Open MPI 5)
)

func (l openMPI) String() string {
	if l.prrte {
		return "prrte"
	}
	return "openmpi"
}

func (l openMPI) naming() naming {
	if l.prrte {
		return naming{commands: []string{"prterun", "prun", "mpirun.prrte"}, spellings: []string{"prrte", "openmpi5"}}
	}
	return naming{commands: []string{"orterun", "mpirun.openmpi", "mpiexec.openmpi", "oshrun"}, spellings: []string{"openmpi", "ompi", "orte"}}
}

// openMPIArity lists only what matters for finding host options and the
// program, not every option orterun has.
var openMPIArity = map[string]int{
	"-np": 1, "-n": 1, "-c": 1, "--np": 1, "-N": 1, "--npernode": 1, "-npernode": 1,
	"--mca": 2, "-mca": 2, "--gmca": 2, "-gmca": 2, "-am": 1, "--am": 1,
	"-x": 1, "--map-by": 1, "-map-by": 1, "--bind-to": 1, "-bind-to": 1,
	"--rank-by": 1, "-rank-by": 1, "--cpus-per-proc": 1, "--prefix": 1,
	"-wdir": 1, "--wdir": 1, "-wd": 1, "--path": 1, "--tmpdir": 1,
	"--output-filename": 1, "--timeout": 1, "--report-uri": 1, "--ompi-server": 1,
	"-machinefile": 1, "--machinefile": 1, "-hostfile": 1, "--hostfile": 1,
	"-default-hostfile": 1, "--default-hostfile": 1, "-H": 1, "-host": 1, "--host": 1,
	"--launch-agent": 1, "--rankfile": 1, "-rf": 1, "--app": 1, "--preload-files": 1,
}

func (openMPI) arity() map[string]int { return openMPIArity }

var openMPIHostOptions = map[string]hostOption{
	"-machinefile": {true}, "--machinefile": {true},
	"-hostfile": {true}, "--hostfile": {true},
	"-default-hostfile": {true}, "--default-hostfile": {true},
	"-H": {false}, "-host": {false}, "--host": {false},
}

func (openMPI) hostOptions() map[string]hostOption { return openMPIHostOptions }

func (openMPI) hostList(s string) ([]Host, error) { return parseHostList(s) }

// orterun has no -f: `mpiexec -f hosts` there runs every rank on this host.
var openMPIForeign = map[string]string{"-f": "MPICH's", "-hosts": "MPICH's", "--hosts": "MPICH's", "-w": "srun's", "--nodelist": "srun's"}

func (l openMPI) foreignHostOptions() (map[string]string, string) {
	if l.prrte {
		return openMPIForeign, "Open MPI 5's"
	}
	return openMPIForeign, "Open MPI's"
}

func (openMPI) withEnv(argv []string, vars [][2]string) ([]string, error) {
	var extra []string
	for _, kv := range vars {
		extra = append(extra, "-x", kv[0]+"="+kv[1])
	}
	return afterLauncher(argv, extra...), nil
}

func (openMPI) hostfileOption() string { return "--hostfile" }

func (openMPI) hostfileLine(h Host) string { return fmt.Sprintf("%s slots=%d", h.Name, h.Slots) }

func (l openMPI) withoutHosts(argv []string, keep []Host, src []HostSource, drop map[string]bool, dir string) ([]string, error) {
	return withoutHostsIn(l, argv, keep, src, drop, dir)
}

func (l openMPI) withNodefile(argv []string, b HostSource) ([]string, []HostSource) {
	return withHostfile(l, argv, b.File)
}

// agentOptions: orterun starts its daemons with plm_rsh_agent. (PRRTE's
// is set with --prtemca, which the user gives.)
func (l openMPI) agentOptions(via string, opts []argOption, getenv func(string) string) []string {
	if l.prrte || agentGiven(opts) || getenv("OMPI_MCA_plm_rsh_agent") != "" || getenv("OMPI_MCA_orte_rsh_agent") != "" {
		return nil
	}
	return []string{"--mca", "plm_rsh_agent", via}
}
