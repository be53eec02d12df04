package wrap

import (
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
)

// Slurm's srun starts the ranks itself (PMI/PMIx) on the job's
// allocation: --export carries the ranks' environment, -w/--nodelist and
// -F/--nodefile name hosts in Slurm's bracket syntax, and --exclude keeps
// ranks off the gateway hosts.
type srun struct{}

var Slurm Flavour = srun{} // srun: Slurm starts the ranks itself (PMI/PMIx)

func (srun) String() string { return "slurm" }

func (srun) naming() naming {
	return naming{commands: []string{"srun"}, spellings: []string{"slurm", "srun"}, help: "slurm for srun"}
}

// srunArity: long options are usually written --name=value, which
// scanArgs reads whatever the arity.
var srunArity = map[string]int{
	"-n": 1, "--ntasks": 1, "-N": 1, "--nodes": 1, "-w": 1, "--nodelist": 1, "-x": 1, "--exclude": 1,
	"-F": 1, "--nodefile": 1, "-c": 1, "--cpus-per-task": 1, "--ntasks-per-node": 1, "--mpi": 1,
	"-p": 1, "--partition": 1, "-t": 1, "--time": 1, "-A": 1, "--account": 1, "--export": 1,
	"-o": 1, "--output": 1, "-e": 1, "--error": 1, "-J": 1, "--job-name": 1, "-D": 1, "--chdir": 1,
	"-m": 1, "--distribution": 1, "--mem": 1, "--mem-per-cpu": 1, "-C": 1, "--constraint": 1,
	"-q": 1, "--qos": 1, "--cpu-bind": 1, "-G": 1, "--gpus": 1,
}

func (srun) arity() map[string]int { return srunArity }

// srunHostOptions: -x is --exclude for srun, not a host list.
var srunHostOptions = map[string]hostOption{"-w": {false}, "--nodelist": {false}, "-F": {true}, "--nodefile": {true}}

func (srun) hostOptions() map[string]hostOption { return srunHostOptions }

func (srun) hostList(s string) ([]Host, error) { return slurmHosts(s) }

func (srun) foreignHostOptions() (map[string]string, string) { return nil, "" }

// withEnv passes the variables with srun's --export: ALL keeps the
// user's environment (srun's default), the list adds ours. A --export the
// user gave gets ours appended, since srun takes the last one. (-x is
// --exclude for srun, never an environment option.)
func (l srun) withEnv(argv []string, vars [][2]string) ([]string, error) {
	var kvs []string
	for _, kv := range vars {
		if strings.Contains(kv[1], ",") {
			return nil, fmt.Errorf("%s=%q holds a comma, which srun --export cannot carry (it separates variables): set it without one, e.g. unset %s before mpi5k run", kv[0], kv[1], kv[0])
		}
		kvs = append(kvs, kv[0]+"="+kv[1])
	}
	ours := strings.Join(kvs, ",")
	opts, _ := scanArgs(l, argv)
	out := append([]string(nil), argv...)
	for _, o := range opts {
		if o.Name != "--export" || len(o.Values) != 1 {
			continue
		}
		v := o.Values[0] + "," + ours
		if o.Inline {
			out[o.Index] = "--export=" + v
		} else {
			out[o.Index+1] = v
		}
		return out, nil
	}
	return afterLauncher(argv, "--export=ALL,"+ours), nil
}

// withoutHosts excludes the gateway hosts from the allocation; a node
// list the user gave is the user's to shorten.
func (srun) withoutHosts(argv []string, _ []Host, src []HostSource, drop map[string]bool, _ string) ([]string, error) {
	if len(src) > 0 && src[0].ArgIdx >= 0 {
		return nil, fmt.Errorf("--dedicated-gateways with srun %s: list the ranks' nodes without the gateway hosts yourself, or leave out %s (the allocation minus --exclude is then used)", src[0].Option, src[0].Option)
	}
	var gws []string
	for name := range drop {
		gws = append(gws, name)
	}
	sort.Strings(gws)
	return afterLauncher(argv, "--exclude="+strings.Join(gws, ",")), nil
}

// withNodefile: srun needs none, Slurm knows its allocation.
func (srun) withNodefile(argv []string, _ HostSource) ([]string, []HostSource) { return argv, nil }

// agentOptions: srun starts no daemons of its own over a remote shell.
func (srun) agentOptions(string, []argOption, func(string) string) []string { return nil }

// expandSlurm expands a Slurm node list ("g-[1-3,5].nancy,h-7"), with
// scontrol when it is installed (it knows every syntax), else here.
func expandSlurm(list string) ([]string, error) {
	if p, err := lookPath("scontrol"); err == nil {
		out, err := exec.Command(p, "show", "hostnames", list).Output()
		if err == nil {
			return strings.Fields(string(out)), nil
		}
	}
	return expandHostlist(list)
}

// expandHostlist implements Slurm's bracket syntax: a comma-separated list
// of items, each with zero or more [ranges] (zero-padding kept).
func expandHostlist(list string) ([]string, error) {
	var items []string
	depth, start := 0, 0
	for i, r := range list {
		switch r {
		case '[':
			depth++
		case ']':
			depth--
			if depth < 0 {
				return nil, fmt.Errorf("unbalanced ']' in %q", list)
			}
		case ',':
			if depth == 0 {
				items = append(items, list[start:i])
				start = i + 1
			}
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("unbalanced '[' in %q", list)
	}
	items = append(items, list[start:])
	var out []string
	for _, it := range items {
		if it == "" {
			return nil, fmt.Errorf("empty item in %q", list)
		}
		names, err := expandItem(it)
		if err != nil {
			return nil, err
		}
		out = append(out, names...)
	}
	return out, nil
}

func expandItem(it string) ([]string, error) {
	open := strings.IndexByte(it, '[')
	if open < 0 {
		return []string{it}, checkHostName(it)
	}
	end := strings.IndexByte(it[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("unbalanced '[' in %q", it)
	}
	end += open
	prefix, body, rest := it[:open], it[open+1:end], it[end+1:]
	if prefix != "" {
		if err := checkHostName(prefix); err != nil {
			return nil, err
		}
	}
	restNames := []string{""}
	if rest != "" {
		var err error
		if restNames, err = expandItem(rest); err != nil {
			return nil, err
		}
	}
	var out []string
	for _, r := range strings.Split(body, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || b < a || b-a > 100000 {
			return nil, fmt.Errorf("bad range %q in %q", r, it)
		}
		for n := a; n <= b; n++ {
			num := strconv.Itoa(n)
			for len(num) < len(lo) {
				num = "0" + num // "[01-10]" keeps its padding
			}
			for _, t := range restNames {
				out = append(out, prefix+num+t)
			}
		}
	}
	return out, nil
}

// slurmHosts reads a Slurm host list (node[1-4],gpu7), as srun -w takes it.
func slurmHosts(list string) ([]Host, error) {
	names, err := expandSlurm(list)
	if err != nil {
		return nil, err
	}
	hs := make([]Host, len(names))
	for i, n := range names {
		if err := checkHostName(n); err != nil {
			return nil, err
		}
		hs[i] = Host{Name: n}
	}
	return hs, nil
}
