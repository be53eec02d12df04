package wrap

import (
	"strings"
)

// arity of launcher options that take values, per flavour. Options not
// listed are guessed by scanArgs. Only what matters for finding host
// options and the program is listed, not every option a launcher has.
var optionArity = map[Flavour]map[string]int{
	OpenMPI: {
		"-np": 1, "-n": 1, "-c": 1, "--np": 1, "-N": 1, "--npernode": 1, "-npernode": 1,
		"--mca": 2, "-mca": 2, "--gmca": 2, "-gmca": 2, "-am": 1, "--am": 1,
		"-x": 1, "--map-by": 1, "-map-by": 1, "--bind-to": 1, "-bind-to": 1,
		"--rank-by": 1, "-rank-by": 1, "--cpus-per-proc": 1, "--prefix": 1,
		"-wdir": 1, "--wdir": 1, "-wd": 1, "--path": 1, "--tmpdir": 1,
		"--output-filename": 1, "--timeout": 1, "--report-uri": 1, "--ompi-server": 1,
		"-machinefile": 1, "--machinefile": 1, "-hostfile": 1, "--hostfile": 1,
		"-default-hostfile": 1, "--default-hostfile": 1, "-H": 1, "-host": 1, "--host": 1,
		"--launch-agent": 1, "--rankfile": 1, "-rf": 1, "--app": 1, "--preload-files": 1,
	},
	Hydra: {
		"-n": 1, "-np": 1, "-ppn": 1, "-genv": 2, "-env": 2, "-genvlist": 1, "-envlist": 1,
		"-f": 1, "-machinefile": 1, "--machinefile": 1, "-hostfile": 1, "--hostfile": 1,
		"-hosts": 1, "-host": 1, "--hosts": 1, "--host": 1,
		"-launcher": 1, "-launcher-exec": 1, "-bootstrap": 1, "-bootstrap-exec": 1,
		"-iface": 1, "-bind-to": 1, "-map-by": 1, "-wdir": 1, "-configfile": 1,
		"-rmk": 1, "-demux": 1, "-prepend-pattern": 1, "-outfile-pattern": 1,
		"-errfile-pattern": 1, "-gpus-per-proc": 1, "-channel": 1, "-tmpdir": 1,
	},
}

func init() {
	// srun's options with a value; long ones are usually written
	// --name=value, which scanArgs reads whatever the arity.
	optionArity[Slurm] = map[string]int{
		"-n": 1, "--ntasks": 1, "-N": 1, "--nodes": 1, "-w": 1, "--nodelist": 1, "-x": 1, "--exclude": 1,
		"-F": 1, "--nodefile": 1, "-c": 1, "--cpus-per-task": 1, "--ntasks-per-node": 1, "--mpi": 1,
		"-p": 1, "--partition": 1, "-t": 1, "--time": 1, "-A": 1, "--account": 1, "--export": 1,
		"-o": 1, "--output": 1, "-e": 1, "--error": 1, "-J": 1, "--job-name": 1, "-D": 1, "--chdir": 1,
		"-m": 1, "--distribution": 1, "--mem": 1, "--mem-per-cpu": 1, "-C": 1, "--constraint": 1,
		"-q": 1, "--qos": 1, "--cpu-bind": 1, "-G": 1, "--gpus": 1,
	}
	optionArity[PRRTE] = optionArity[OpenMPI]
	intel := map[string]int{"-genvall": 0, "-perhost": 1, "-rr": 0, "-print-rank-map": 0}
	for k, v := range optionArity[Hydra] {
		intel[k] = v
	}
	optionArity[IntelMPI] = intel
}

// argOption is one option found on the launcher's command line.
type argOption struct {
	Index  int      // position of the option word in argv
	Name   string   // without "=value"
	Values []string // its values (from "=value" or the following words)
	Inline bool     // value given as --name=value
}

// scanArgs walks an mpirun argv (argv[0] the launcher) and returns the
// options and the index of the program (len(argv) if there is none).
func scanArgs(f Flavour, argv []string) (opts []argOption, prog int) {
	arity := optionArity[f]
	i := 1
	for i < len(argv) {
		a := argv[i]
		if a == "--" {
			return opts, i + 1
		}
		if a == ":" || !strings.HasPrefix(a, "-") || a == "-" {
			return opts, i
		}
		name, val, inline := strings.Cut(a, "=")
		o := argOption{Index: i, Name: name, Inline: inline}
		n, known := arity[name]
		if !known {
			n = guessArity(argv, i)
		}
		if inline {
			o.Values = []string{val}
			n--
		}
		for ; n > 0 && i+1 < len(argv); n-- {
			i++
			o.Values = append(o.Values, argv[i])
		}
		opts = append(opts, o)
		i++
	}
	return opts, len(argv)
}

// guessArity decides whether an unknown option takes one value: not when
// the next word is another option or looks like the program to run.
func guessArity(argv []string, i int) int {
	if i+1 >= len(argv) {
		return 0
	}
	next := argv[i+1]
	if strings.HasPrefix(next, "-") || looksLikeProgram(next) {
		return 0
	}
	return 1
}

func looksLikeProgram(w string) bool {
	if strings.Contains(w, "/") {
		return true
	}
	_, err := lookPath(w)
	return err == nil
}
