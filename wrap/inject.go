package wrap

import (
	"fmt"
	"sort"
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

// Command returns the launcher command line with the injection, in the
// way the flavour passes environment to the ranks. Only the ranks get the
// preload, not the launcher's daemons.
func (in Inject) Command(f Flavour, argv []string, getenv func(string) string) ([]string, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("no mpirun command")
	}
	if f == nil {
		return nil, fmt.Errorf("cannot inject environment into an MPI launcher of unknown flavour")
	}
	return f.withEnv(argv, in.vars(getenv))
}

// WithoutHosts rewrites argv so that the hosts in drop run no ranks
// (--dedicated-gateways), as the flavour names its hosts: hostfiles are
// filtered into dir, host lists edited. When the hosts came from the batch
// system, a hostfile option is added (srun: --exclude).
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
	return f.withoutHosts(argv, keep, src, drop, dir)
}
