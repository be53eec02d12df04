package wrap

import "fmt"

// MPICH's launcher, mpiexec.hydra, and Intel MPI's, which is hydra with
// options of its own. Both take -genv NAME VALUE for the ranks'
// environment and machinefiles of "host:N" lines.
type hydra struct{ intel bool }

var (
	Hydra    Flavour = hydra{}            // MPICH's mpiexec.hydra
	IntelMPI Flavour = hydra{intel: true} // Intel MPI's mpiexec.hydra / mpirun
)

func (l hydra) String() string {
	if l.intel {
		return "intel-mpi"
	}
	return "mpich-hydra"
}

func (l hydra) naming() naming {
	if l.intel {
		// Intel MPI's commands are the generic mpirun and mpiexec.hydra:
		// it is told by its installation (DetectFlavour).
		return naming{spellings: []string{"intel", "intel-mpi", "impi"}}
	}
	return naming{commands: []string{"mpiexec.hydra", "mpiexec.mpich", "mpirun.mpich", "mpiexec.mpich2"}, spellings: []string{"mpich", "hydra", "mpich-hydra"}}
}

// hydraArity lists only what matters for finding host options and the
// program, not every option hydra has.
var hydraArity = map[string]int{
	"-n": 1, "-np": 1, "-ppn": 1, "-genv": 2, "-env": 2, "-genvlist": 1, "-envlist": 1,
	"-f": 1, "-machinefile": 1, "--machinefile": 1, "-hostfile": 1, "--hostfile": 1,
	"-hosts": 1, "-host": 1, "--hosts": 1, "--host": 1,
	"-launcher": 1, "-launcher-exec": 1, "-bootstrap": 1, "-bootstrap-exec": 1,
	"-iface": 1, "-bind-to": 1, "-map-by": 1, "-wdir": 1, "-configfile": 1,
	"-rmk": 1, "-demux": 1, "-prepend-pattern": 1, "-outfile-pattern": 1,
	"-errfile-pattern": 1, "-gpus-per-proc": 1, "-channel": 1, "-tmpdir": 1,
}

// intelArity is hydra's and Intel MPI's own.
var intelArity = func() map[string]int {
	m := map[string]int{"-genvall": 0, "-perhost": 1, "-rr": 0, "-print-rank-map": 0}
	for k, v := range hydraArity {
		m[k] = v
	}
	return m
}()

func (l hydra) arity() map[string]int {
	if l.intel {
		return intelArity
	}
	return hydraArity
}

var hydraHostOptions = map[string]hostOption{
	"-f": {true}, "-machinefile": {true}, "--machinefile": {true},
	"-hostfile": {true}, "--hostfile": {true},
	"-hosts": {false}, "-host": {false}, "--hosts": {false}, "--host": {false},
}

func (hydra) hostOptions() map[string]hostOption { return hydraHostOptions }

func (hydra) hostList(s string) ([]Host, error) { return parseHostList(s) }

func (l hydra) foreignHostOptions() (map[string]string, string) {
	if l.intel {
		return nil, ""
	}
	return map[string]string{"-H": "Open MPI's", "--default-hostfile": "Open MPI's", "-w": "srun's", "--nodelist": "srun's"}, "MPICH's"
}

func (hydra) withEnv(argv []string, vars [][2]string) ([]string, error) {
	var extra []string
	for _, kv := range vars {
		extra = append(extra, "-genv", kv[0], kv[1])
	}
	return afterLauncher(argv, extra...), nil
}

func (hydra) hostfileOption() string { return "-f" }

func (hydra) hostfileLine(h Host) string { return fmt.Sprintf("%s:%d", h.Name, h.Slots) }

func (l hydra) withoutHosts(argv []string, keep []Host, src []HostSource, drop map[string]bool, dir string) ([]string, error) {
	return withoutHostsIn(l, argv, keep, src, drop, dir)
}

func (l hydra) withNodefile(argv []string, b HostSource) ([]string, []HostSource) {
	return withHostfile(l, argv, b.File)
}

// agentOptions: hydra starts its daemons with -launcher ssh and the
// command -launcher-exec names.
func (hydra) agentOptions(via string, opts []argOption, getenv func(string) string) []string {
	if agentGiven(opts, "-launcher", "-launcher-exec", "-bootstrap", "-bootstrap-exec") ||
		getenv("HYDRA_LAUNCHER_EXEC") != "" || getenv("I_MPI_HYDRA_BOOTSTRAP_EXEC") != "" {
		return nil
	}
	return []string{"-launcher", "ssh", "-launcher-exec", via}
}
