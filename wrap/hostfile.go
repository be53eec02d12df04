package wrap

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// A hostfileLauncher names its hosts in options and files the run can
// rewrite (Open MPI's, MPICH's): --dedicated-gateways filters them, and a
// batch system's node file is passed as one.
type hostfileLauncher interface {
	Flavour
	hostfileOption() string     // the option that names a hostfile
	hostfileLine(h Host) string // a hostfile's line for h, which has slots
}

// withHostfile adds the hostfile option for file.
func withHostfile(l hostfileLauncher, argv []string, file string) ([]string, []HostSource) {
	opt := l.hostfileOption()
	return afterLauncher(argv, opt, file), []HostSource{{Option: opt, File: file, ArgIdx: 1}}
}

// withoutHostsIn edits the host options of argv (hostfiles are filtered
// into dir, host lists edited) so that the hosts in drop run no ranks.
// When the hosts came from the batch system, a hostfile of keep is added.
func withoutHostsIn(l hostfileLauncher, argv []string, keep []Host, src []HostSource, drop map[string]bool, dir string) ([]string, error) {
	if len(src) == 0 || src[0].ArgIdx < 0 {
		p, err := writeHostfile(l, dir, "hosts.ranks", keep)
		if err != nil {
			return nil, err
		}
		out, _ := withHostfile(l, argv, p)
		return out, nil
	}
	out := append([]string(nil), argv...)
	opts, _ := scanArgs(l, argv)
	for n, s := range src {
		var o *argOption
		for i := range opts {
			if opts[i].Index == s.ArgIdx {
				o = &opts[i]
				break
			}
		}
		if o == nil {
			return nil, fmt.Errorf("internal: host option %s not found again", s.Option)
		}
		var val string
		if s.File != "" {
			p, err := writeHostfile(l, dir, fmt.Sprintf("hosts.%d", n), keepFrom(s, drop))
			if err != nil {
				return nil, err
			}
			val = p
		} else {
			hs, _ := parseHostList(o.Values[0])
			var items []string
			for _, h := range hs {
				if drop[h.Name] {
					continue
				}
				if h.Slots > 0 {
					items = append(items, fmt.Sprintf("%s:%d", h.Name, h.Slots))
				} else {
					items = append(items, h.Name)
				}
			}
			if len(items) == 0 {
				return nil, fmt.Errorf("%s: --dedicated-gateways leaves no host in this list", s.Option)
			}
			val = strings.Join(items, ",")
		}
		if o.Inline {
			out[o.Index] = o.Name + "=" + val
		} else {
			out[o.Index+1] = val
		}
	}
	return out, nil
}

// keepFrom is the hostfile of s without the hosts in drop, line by line.
func keepFrom(s HostSource, drop map[string]bool) []Host {
	hs, _ := readHostfile(s.File, false)
	var keep []Host
	for _, h := range hs {
		if !drop[h.Name] {
			keep = append(keep, h)
		}
	}
	return keep
}

func writeHostfile(l hostfileLauncher, dir, name string, hosts []Host) (string, error) {
	var b strings.Builder
	for _, h := range hosts {
		if h.Slots == 0 {
			fmt.Fprintln(&b, h.Name)
		} else {
			fmt.Fprintln(&b, l.hostfileLine(h))
		}
	}
	p := filepath.Join(dir, name)
	return p, os.WriteFile(p, []byte(b.String()), 0o644)
}
