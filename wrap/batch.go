package wrap

import (
	"fmt"
	"strings"
)

// A batch system names the job's hosts in its environment: a node file
// (OAR, PBS/Torque) or a node list (Slurm). A command line that names no
// hosts runs on them.

// batchNodes are the variables asked, in order: each is a file of hosts,
// or a list read by list. A new batch system is a line here (and, if it
// has a launcher of its own, a Flavour).
var batchNodes = []struct {
	env  string
	list func(string) ([]string, error) // nil: the value is a node file
	also bool                           // another name of the one before, which messages name alone
}{
	{env: "OAR_NODEFILE"},
	{env: "OAR_FILE_NODES", also: true},
	{env: "PBS_NODEFILE"},
	{env: "SLURM_JOB_NODELIST", list: expandSlurm}, // expanded with scontrol when present
}

// errNoHosts: the command names no hosts and no batch system is set.
func errNoHosts() error {
	var vars []string
	for _, b := range batchNodes {
		if !b.also {
			vars = append(vars, "$"+b.env)
		}
	}
	return fmt.Errorf("no host list: the command has no hostfile/host option and no batch system (%s) is set", strings.Join(vars, ", "))
}

// HostsFromBatch reads the host list of the batch system the job runs in:
// OAR, PBS/Torque, or Slurm.
func HostsFromBatch(getenv func(string) string) ([]Host, *HostSource, error) {
	for _, b := range batchNodes {
		v := getenv(b.env)
		if v == "" {
			continue
		}
		if b.list == nil {
			hs, err := readHostfile(v, true)
			if err != nil {
				return nil, nil, fmt.Errorf("$%s: %w", b.env, err)
			}
			return mergeHosts(hs), &HostSource{Option: "$" + b.env, File: v, ArgIdx: -1}, nil
		}
		names, err := b.list(v)
		if err != nil {
			return nil, nil, fmt.Errorf("$%s: %w", b.env, err)
		}
		hs := make([]Host, len(names))
		for i, n := range names {
			hs[i] = Host{Name: n}
		}
		return mergeHosts(hs), &HostSource{Option: "$" + b.env, ArgIdx: -1}, nil
	}
	return nil, nil, nil
}

// WithBatchHostfile gives a launcher without a host option the batch
// system's node file (OAR, PBS): Open MPI and MPICH read no $OAR_NODEFILE
// and would start every rank on this host. The file's repeated lines
// count as slots for both, as when a user writes -machinefile
// $OAR_NODEFILE. srun needs nothing: Slurm knows its allocation.
func WithBatchHostfile(f Flavour, argv []string, b HostSource) ([]string, []HostSource) {
	if b.File == "" || len(argv) == 0 {
		return argv, nil
	}
	return f.withNodefile(argv, b)
}
