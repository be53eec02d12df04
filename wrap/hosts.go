package wrap

import (
	"bufio"
	"fmt"
	"os"
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

// checkHostOptions refuses a host-list option of another launcher family,
// naming the flavour found and how it was found.
func checkHostOptions(f Flavour, argv []string) error {
	foreign, family := f.foreignHostOptions()
	if foreign == nil {
		return nil
	}
	opts, _ := scanArgs(f, argv)
	for _, o := range opts {
		if whose, ok := foreign[o.Name]; ok {
			var own []string
			for n := range f.hostOptions() {
				if !strings.HasPrefix(n, "--") {
					own = append(own, n)
				}
			}
			slices.Sort(own)
			return fmt.Errorf("%s is %s host option, but %s is %s launcher (flavour %s, %s), which does not take it: "+
				"give it its own (%s), or name the launcher you meant (e.g. mpiexec.mpich, mpirun.openmpi) or --flavour",
				o.Name, whose, argv[0], family, f, flavourOrigin(argv[0]), strings.Join(own, ", "))
		}
	}
	return nil
}

// HostsFromArgs reads the host list an mpirun command line names. args is
// the full command (args[0] the launcher). Several options add up, in
// order. It returns no hosts when the command names none.
func HostsFromArgs(f Flavour, args []string) (hosts []Host, src []HostSource, err error) {
	hostOpts := f.hostOptions()
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
		if ho.file {
			s.File = val
			hs, err = readHostfile(val, false)
		} else {
			hs, err = f.hostList(val)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s %s: %w", o.Name, val, err)
		}
		hosts = append(hosts, hs...)
		src = append(src, s)
	}
	return mergeHosts(hosts), src, nil
}

// readHostfile reads an Open MPI hostfile ("host slots=N max_slots=M"),
// a hydra machinefile ("host:N") or a batch nodefile (a host per line,
// repeated once per core: each line without a count is one slot).
// Comments start with '#'.
func readHostfile(path string, nodefile bool) ([]Host, error) {
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
		if h.Slots == 0 && nodefile {
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
