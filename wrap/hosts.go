package wrap

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Host is one entry of the job's host list. Slots is 0 when the list did
// not say (the launcher then decides).
type Host struct {
	Name  string
	Slots int
}

// HostSource says where a host list came from, for messages.
type HostSource struct {
	Option string // "--hostfile", "-H", "$OAR_NODEFILE", ...
	File   string // the file read, if any
	ArgIdx int    // index in the mpirun argv of the option (-1 for batch env)
}

// hostOption describes one host-list option of a flavour.
type hostOption struct {
	file bool // value is a file (else a comma-separated list)
}

func hostOptions(f Flavour) map[string]hostOption {
	switch f {
	case OpenMPI, PRRTE:
		return map[string]hostOption{
			"-machinefile": {true}, "--machinefile": {true},
			"-hostfile": {true}, "--hostfile": {true},
			"-default-hostfile": {true}, "--default-hostfile": {true},
			"-H": {false}, "-host": {false}, "--host": {false},
		}
	case Hydra, IntelMPI:
		return map[string]hostOption{
			"-f": {true}, "-machinefile": {true}, "--machinefile": {true},
			"-hostfile": {true}, "--hostfile": {true},
			"-hosts": {false}, "-host": {false}, "--hosts": {false}, "--host": {false},
		}
	case Slurm:
		// -x is --exclude for srun: not a host list.
		return map[string]hostOption{"-w": {false}, "--nodelist": {false}, "-F": {true}, "--nodefile": {true}}
	}
	return nil
}

// foreignHostOptions are host-list options of one launcher family that
// another family's launcher does not take: Open MPI's orterun has no -f,
// so `mpiexec -f hosts` there runs every rank on this host.
var foreignHostOptions = map[Flavour]map[string]string{
	OpenMPI: {"-f": "MPICH's", "-hosts": "MPICH's", "--hosts": "MPICH's", "-w": "srun's", "--nodelist": "srun's"},
	PRRTE:   {"-f": "MPICH's", "-hosts": "MPICH's", "--hosts": "MPICH's", "-w": "srun's", "--nodelist": "srun's"},
	Hydra:   {"-H": "Open MPI's", "--default-hostfile": "Open MPI's", "-w": "srun's", "--nodelist": "srun's"},
}

var familyName = map[Flavour]string{OpenMPI: "Open MPI's", PRRTE: "Open MPI 5's", Hydra: "MPICH's"}

// checkHostOptions refuses a host-list option of another launcher family,
// naming the flavour found and how it was found.
func checkHostOptions(f Flavour, argv []string) error {
	foreign := foreignHostOptions[f]
	if foreign == nil {
		return nil
	}
	opts, _ := scanArgs(f, argv)
	for _, o := range opts {
		if whose, ok := foreign[o.Name]; ok {
			var own []string
			for n := range hostOptions(f) {
				if !strings.HasPrefix(n, "--") {
					own = append(own, n)
				}
			}
			slices.Sort(own)
			return fmt.Errorf("%s is %s host option, but %s is %s launcher (flavour %s, %s), which does not take it: "+
				"give it its own (%s), or name the launcher you meant (e.g. mpiexec.mpich, mpirun.openmpi) or --flavour",
				o.Name, whose, argv[0], familyName[f], f, flavourOrigin(argv[0]), strings.Join(own, ", "))
		}
	}
	return nil
}

// flavourOrigin says how the flavour of launcher was found, for a message.
func flavourOrigin(launcher string) string {
	if flavourOfName(filepath.Base(launcher)) != Unknown {
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

// HostsFromArgs reads the host list an mpirun command line names. args is
// the full command (args[0] the launcher). Several options add up, in
// order. It returns no hosts when the command names none.
func HostsFromArgs(f Flavour, args []string) (hosts []Host, src []HostSource, err error) {
	hostOpts := hostOptions(f)
	opts, _ := scanArgs(f, args)
	for _, o := range opts {
		ho, ok := hostOpts[o.Name]
		if !ok {
			continue
		}
		if len(o.Values) != 1 {
			return nil, nil, fmt.Errorf("%s needs a value", o.Name)
		}
		val := o.Values[0]
		s := HostSource{Option: o.Name, ArgIdx: o.Index}
		var hs []Host
		switch {
		case ho.file:
			s.File = val
			hs, err = readHostfile(f, val)
		case f == Slurm:
			hs, err = slurmHosts(val)
		default:
			hs, err = parseHostList(val)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s %s: %w", o.Name, val, err)
		}
		hosts = append(hosts, hs...)
		src = append(src, s)
	}
	return mergeHosts(hosts), src, nil
}

// HostsFromBatch reads the host list of the batch system the job runs in:
// OAR, PBS/Torque, or Slurm (expanded with scontrol when present).
func HostsFromBatch(getenv func(string) string) ([]Host, *HostSource, error) {
	for _, v := range []string{"OAR_NODEFILE", "OAR_FILE_NODES", "PBS_NODEFILE"} {
		if p := getenv(v); p != "" {
			hs, err := readHostfile(Unknown, p)
			if err != nil {
				return nil, nil, fmt.Errorf("$%s: %w", v, err)
			}
			return mergeHosts(hs), &HostSource{Option: "$" + v, File: p, ArgIdx: -1}, nil
		}
	}
	if nl := getenv("SLURM_JOB_NODELIST"); nl != "" {
		names, err := expandSlurm(nl)
		if err != nil {
			return nil, nil, fmt.Errorf("$SLURM_JOB_NODELIST: %w", err)
		}
		hs := make([]Host, len(names))
		for i, n := range names {
			hs[i] = Host{Name: n}
		}
		return mergeHosts(hs), &HostSource{Option: "$SLURM_JOB_NODELIST", ArgIdx: -1}, nil
	}
	return nil, nil, nil
}

// readHostfile reads an Open MPI hostfile ("host slots=N max_slots=M"),
// a hydra machinefile ("host:N") or a batch nodefile (a host per line,
// repeated once per core). Comments start with '#'.
func readHostfile(f Flavour, path string) ([]Host, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	var hosts []Host
	sc := bufio.NewScanner(fh)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		h, err := parseHostSpec(fields[0])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		for _, kv := range fields[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue // hydra "ifhn" style words and the like
			}
			if k == "slots" || k == "cpu" {
				n, err := strconv.Atoi(v)
				if err != nil || n < 1 {
					return nil, fmt.Errorf("%s:%d: bad %s=%q", path, line, k, v)
				}
				h.Slots = n
			}
		}
		if h.Slots == 0 && f == Unknown {
			h.Slots = 1 // batch nodefiles list a host once per core
		}
		hosts = append(hosts, h)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("%s: no hosts", path)
	}
	return hosts, nil
}

// parseHostList reads "a,b:2,c" (-H / -hosts).
func parseHostList(s string) ([]Host, error) {
	var hosts []Host
	for _, item := range strings.Split(s, ",") {
		if item == "" {
			return nil, fmt.Errorf("empty host name in list %q", s)
		}
		h, err := parseHostSpec(item)
		if err != nil {
			return nil, err
		}
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// parseHostSpec reads "host", "host:N" or hydra's "host:N:ifname".
func parseHostSpec(s string) (Host, error) {
	name, rest, hasCount := strings.Cut(s, ":")
	if err := checkHostName(name); err != nil {
		return Host{}, err
	}
	h := Host{Name: name}
	if hasCount {
		count, _, _ := strings.Cut(rest, ":")
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 {
			return Host{}, fmt.Errorf("bad slot count in %q", s)
		}
		h.Slots = n
	}
	return h, nil
}

func checkHostName(name string) error {
	if name == "" {
		return fmt.Errorf("empty host name")
	}
	for _, r := range name {
		ok := r == '-' || r == '.' || r == '_' || r == ':' ||
			(r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if !ok {
			return fmt.Errorf("invalid host name %q", name)
		}
	}
	return nil
}

// mergeHosts folds repeated names into one entry (slots added), keeping
// first-appearance order: "the last host of a site" depends on it.
func mergeHosts(in []Host) []Host {
	idx := map[string]int{}
	var out []Host
	for _, h := range in {
		if i, ok := idx[h.Name]; ok {
			out[i].Slots += h.Slots
			continue
		}
		idx[h.Name] = len(out)
		out = append(out, h)
	}
	return out
}

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
