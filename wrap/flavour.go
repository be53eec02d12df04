package wrap

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Flavour is a family of MPI launchers: how its command line spells host
// lists, how environment reaches the ranks, how it starts its daemons. Each
// family is a type of its own (launch_openmpi.go, launch_hydra.go,
// launch_srun.go) and is listed in flavours; the methods are what the rest
// of the package asks, so that no call site needs to know which family it
// holds. A nil Flavour is one not known (yet).
type Flavour interface {
	// String is the flavour's name, as a dry run prints it.
	String() string
	// naming says how the flavour is named: by its launchers' commands
	// and by --flavour.
	naming() naming

	// arity gives the number of values of the launcher's options that
	// take any (scanArgs); options not listed are guessed.
	arity() map[string]int
	// hostOptions are the launcher's options that name hosts.
	hostOptions() map[string]hostOption
	// hostList reads the value of a host option that is a list.
	hostList(s string) ([]Host, error)
	// foreignHostOptions are other families' host options that this
	// launcher does not take, each with whose it is ("MPICH's"), and
	// family is how a message names this one ("Open MPI's"). nil: none
	// is checked.
	foreignHostOptions() (foreign map[string]string, family string)

	// withEnv sets vars in the ranks' environment.
	withEnv(argv []string, vars [][2]string) ([]string, error)
	// withoutHosts rewrites argv so that the hosts in drop run no ranks;
	// keep are the job's other hosts, src where argv named its hosts
	// (none, or a batch system's), dir where new hostfiles go.
	withoutHosts(argv []string, keep []Host, src []HostSource, drop map[string]bool, dir string) ([]string, error)
	// withNodefile gives argv, which names no hosts, the batch system's
	// node file b, and says where it now names them (nil: argv needs
	// none, argv is returned unchanged).
	withNodefile(argv []string, b HostSource) ([]string, []HostSource)
	// agentOptions are the options that make the launcher start its
	// daemons with via (oarsh), nil when opts or the environment already
	// say how it starts them or the launcher has no such option.
	agentOptions(via string, opts []argOption, getenv func(string) string) []string
}

// naming is how a flavour is named.
type naming struct {
	commands  []string // launcher command names (basenames) that are this flavour
	spellings []string // --flavour values; the first is what messages offer
	help      string   // how --flavour's help names it ("" : the first spelling)
}

// flavours are the launcher families, in the order --flavour's help and
// errors list them. A new family is a launch_<family>.go file and a line
// here.
var flavours = []Flavour{OpenMPI, PRRTE, Hydra, IntelMPI, Slurm}

// DetectFlavour names the flavour of launcher path. Generic names (mpirun,
// mpiexec) are resolved through their symlinks (Debian's alternatives) and,
// failing that, the environment of an Intel MPI installation.
func DetectFlavour(launcher string) (Flavour, error) {
	if f := flavourOfName(filepath.Base(launcher)); f != nil {
		return f, nil
	}
	path := launcher
	if !strings.Contains(launcher, "/") {
		p, err := lookPath(launcher)
		if err != nil {
			return nil, fmt.Errorf("launcher %q not found on PATH", launcher)
		}
		path = p
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		if f := flavourOfName(filepath.Base(real)); f != nil {
			return f, nil
		}
		if f := flavourOfInstall(real); f != nil {
			return f, nil
		}
	}
	if os.Getenv("I_MPI_ROOT") != "" {
		return IntelMPI, nil
	}
	return nil, fmt.Errorf("cannot tell the MPI flavour of %q (use an explicit name such as mpirun.openmpi or mpiexec.mpich, or --flavour)", launcher)
}

// flavourOfInstall names the MPI whose installation a generic launcher's
// resolved path is in, by the names in the path: Intel MPI's first, as
// its paths may also hold other MPIs' names.
func flavourOfInstall(real string) Flavour {
	switch {
	case strings.Contains(strings.ToLower(real), "intel") || strings.Contains(real, "/impi/"):
		return IntelMPI
	case strings.Contains(real, "openmpi"):
		return OpenMPI
	case strings.Contains(real, "mpich"):
		return Hydra
	}
	return nil
}

func flavourOfName(base string) Flavour {
	for _, f := range flavours {
		for _, c := range f.naming().commands {
			if c == base {
				return f
			}
		}
	}
	return nil
}

// ParseFlavour reads a --flavour value.
func ParseFlavour(s string) (Flavour, error) {
	var want []string
	for _, f := range flavours {
		n := f.naming()
		for _, sp := range n.spellings {
			if sp == strings.ToLower(s) {
				return f, nil
			}
		}
		want = append(want, n.spellings[0])
	}
	return nil, fmt.Errorf("unknown MPI flavour %q (want %s or %s)", s, strings.Join(want[:len(want)-1], ", "), want[len(want)-1])
}

// FlavourHelp lists the --flavour values for its help.
func FlavourHelp() string {
	var names []string
	for _, f := range flavours {
		n := f.naming()
		if n.help != "" {
			names = append(names, n.help)
		} else {
			names = append(names, n.spellings[0])
		}
	}
	return strings.Join(names, ", ")
}

// flavourOrigin says how the flavour of launcher was found, for a message.
func flavourOrigin(launcher string) string {
	if flavourOfName(filepath.Base(launcher)) != nil {
		return "by its name"
	}
	path := launcher
	if !strings.Contains(launcher, "/") {
		if p, err := lookPath(launcher); err == nil {
			path = p
		}
	}
	if real, err := filepath.EvalSymlinks(path); err == nil && real != path {
		return "found as " + real
	}
	return "found as " + path
}

// lookPath is a variable so tests can fake the PATH.
var lookPath = exec.LookPath
