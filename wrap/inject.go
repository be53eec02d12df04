package wrap

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Inject is what the ranks need in their environment to use the gateways.
type Inject struct {
	Preload string            // absolute path of libmpi5k.so
	Map     string            // absolute path of the site map, valid on every host
	Env     map[string]string // further variables (MPI5K_TRACE, MPI5K_LOG, ...)
}

// vars lists the variables to set in the ranks, in a stable order.
func (in Inject) vars(getenv func(string) string) [][2]string {
	preload := in.Preload
	if old := getenv("LD_PRELOAD"); old != "" {
		preload += ":" + old
	}
	// Go's asynchronous preemption signal would reach the MPI launcher's
	// own signal handlers (Open MPI forwards it to the job as signal 23);
	// //go:debug cannot turn it off, the environment can.
	godebug := "asyncpreemptoff=1"
	if old := getenv("GODEBUG"); old != "" {
		godebug = old + "," + godebug
	}
	vs := [][2]string{{"LD_PRELOAD", preload}, {"MPI5K_MAP", in.Map}, {"GODEBUG", godebug}}
	keys := make([]string, 0, len(in.Env))
	for k := range in.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		vs = append(vs, [2]string{k, in.Env[k]})
	}
	return vs
}

// Command returns the launcher command line with the injection: options
// are inserted right after the launcher word, where every flavour accepts
// them. Only the ranks get the preload, not the launcher's daemons.
func (in Inject) Command(f Flavour, argv []string, getenv func(string) string) ([]string, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("no mpirun command")
	}
	if f == Slurm {
		return in.slurmCommand(argv, getenv)
	}
	var extra []string
	for _, kv := range in.vars(getenv) {
		switch f {
		case OpenMPI, PRRTE:
			extra = append(extra, "-x", kv[0]+"="+kv[1])
		case Hydra, IntelMPI:
			extra = append(extra, "-genv", kv[0], kv[1])
		default:
			return nil, fmt.Errorf("cannot inject environment into an MPI launcher of unknown flavour")
		}
	}
	out := make([]string, 0, len(argv)+len(extra))
	out = append(out, argv[0])
	out = append(out, extra...)
	out = append(out, argv[1:]...)
	return out, nil
}

// WithoutHosts rewrites argv so that the hosts in drop run no ranks
// (--dedicated-gateways): hostfiles are filtered into dir, host lists
// edited. When the hosts came from the batch system, a hostfile option is
// added.
func WithoutHosts(f Flavour, argv []string, hosts []Host, src []HostSource, drop map[string]bool, dir string) ([]string, error) {
	var keep []Host
	for _, h := range hosts {
		if !drop[h.Name] {
			keep = append(keep, h)
		}
	}
	if len(keep) == 0 {
		return nil, fmt.Errorf("--dedicated-gateways leaves no host for ranks")
	}
	if f == Slurm {
		if len(src) > 0 && src[0].ArgIdx >= 0 {
			return nil, fmt.Errorf("--dedicated-gateways with srun %s: list the ranks' nodes without the gateway hosts yourself, or leave out %s (the allocation minus --exclude is then used)", src[0].Option, src[0].Option)
		}
		var gws []string
		for name := range drop {
			gws = append(gws, name)
		}
		sort.Strings(gws)
		return append([]string{argv[0], "--exclude=" + strings.Join(gws, ",")}, argv[1:]...), nil
	}
	out := append([]string(nil), argv...)
	if len(src) == 0 || src[0].ArgIdx < 0 {
		p, err := writeHostfile(f, dir, "hosts.ranks", keep)
		if err != nil {
			return nil, err
		}
		opt := "--hostfile"
		if f == Hydra || f == IntelMPI {
			opt = "-f"
		}
		return append([]string{out[0], opt, p}, out[1:]...), nil
	}
	opts, _ := scanArgs(f, argv)
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
			p, err := writeHostfile(f, dir, fmt.Sprintf("hosts.%d", n), keepFrom(f, s, drop))
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

func keepFrom(f Flavour, s HostSource, drop map[string]bool) []Host {
	hs, _ := readHostfile(f, s.File)
	var keep []Host
	for _, h := range hs {
		if !drop[h.Name] {
			keep = append(keep, h)
		}
	}
	return keep
}

func writeHostfile(f Flavour, dir, name string, hosts []Host) (string, error) {
	var b strings.Builder
	for _, h := range hosts {
		switch {
		case h.Slots == 0:
			fmt.Fprintln(&b, h.Name)
		case f == Hydra || f == IntelMPI:
			fmt.Fprintf(&b, "%s:%d\n", h.Name, h.Slots)
		default:
			fmt.Fprintf(&b, "%s slots=%d\n", h.Name, h.Slots)
		}
	}
	p := filepath.Join(dir, name)
	return p, os.WriteFile(p, []byte(b.String()), 0o644)
}

// slurmCommand passes the variables with srun's --export: ALL keeps the
// user's environment (srun's default), the list adds ours. A --export the
// user gave gets ours appended, since srun takes the last one. (-x is
// --exclude for srun, never an environment option.)
func (in Inject) slurmCommand(argv []string, getenv func(string) string) ([]string, error) {
	var kvs []string
	for _, kv := range in.vars(getenv) {
		if strings.Contains(kv[1], ",") {
			return nil, fmt.Errorf("%s=%q holds a comma, which srun --export cannot carry (it separates variables): set it without one, e.g. unset %s before mpi5k run", kv[0], kv[1], kv[0])
		}
		kvs = append(kvs, kv[0]+"="+kv[1])
	}
	ours := strings.Join(kvs, ",")
	opts, _ := scanArgs(Slurm, argv)
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
	return append([]string{argv[0], "--export=ALL," + ours}, argv[1:]...), nil
}

// WithBatchHostfile gives a launcher without a host option the batch
// system's node file (OAR, PBS): Open MPI and MPICH read no $OAR_NODEFILE
// and would start every rank on this host. The file's repeated lines
// count as slots for both, as when a user writes -machinefile
// $OAR_NODEFILE. srun needs nothing: Slurm knows its allocation.
func WithBatchHostfile(f Flavour, argv []string, b HostSource) ([]string, []HostSource) {
	if b.File == "" || f == Slurm || len(argv) == 0 {
		return argv, nil
	}
	opt := "--hostfile"
	if f == Hydra || f == IntelMPI {
		opt = "-f"
	}
	out := append([]string{argv[0], opt, b.File}, argv[1:]...)
	return out, []HostSource{{Option: opt, File: b.File, ArgIdx: 1}}
}
