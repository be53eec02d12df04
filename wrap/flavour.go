// Package wrap turns an unmodified mpirun command line into a run through
// the mpi5k gateways: it finds the MPI flavour and the host list, assigns
// hosts to sites, writes the site map, starts one gateway per site, injects
// the preload the way the flavour propagates environment, and tears it all
// down again. scripts/mpirun-wrap and `mpi5k run` are its front ends.
package wrap

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Flavour is the family of an MPI launcher; it decides how host lists are
// spelled and how environment reaches the ranks.
type Flavour int

const (
	Unknown  Flavour = iota
	OpenMPI          // orterun / mpirun.openmpi (ORTE, Open MPI <= 4)
	PRRTE            // prterun / prun (Open MPI 5)
	Hydra            // MPICH's mpiexec.hydra
	IntelMPI         // Intel MPI's mpiexec.hydra / mpirun
	Slurm            // srun: Slurm starts the ranks itself (PMI/PMIx)
)

func (f Flavour) String() string {
	switch f {
	case OpenMPI:
		return "openmpi"
	case PRRTE:
		return "prrte"
	case Hydra:
		return "mpich-hydra"
	case IntelMPI:
		return "intel-mpi"
	case Slurm:
		return "slurm"
	}
	return "unknown"
}

// DetectFlavour names the flavour of launcher path. Generic names (mpirun,
// mpiexec) are resolved through their symlinks (Debian's alternatives) and,
// failing that, the environment of an Intel MPI installation.
func DetectFlavour(launcher string) (Flavour, error) {
	if f := flavourOfName(filepath.Base(launcher)); f != Unknown {
		return f, nil
	}
	path := launcher
	if !strings.Contains(launcher, "/") {
		p, err := lookPath(launcher)
		if err != nil {
			return Unknown, fmt.Errorf("launcher %q not found on PATH", launcher)
		}
		path = p
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		if f := flavourOfName(filepath.Base(real)); f != Unknown {
			return f, nil
		}
		if strings.Contains(strings.ToLower(real), "intel") || strings.Contains(real, "/impi/") {
			return IntelMPI, nil
		}
		if strings.Contains(real, "openmpi") {
			return OpenMPI, nil
		}
		if strings.Contains(real, "mpich") {
			return Hydra, nil
		}
	}
	if os.Getenv("I_MPI_ROOT") != "" {
		return IntelMPI, nil
	}
	return Unknown, fmt.Errorf("cannot tell the MPI flavour of %q (use an explicit name such as mpirun.openmpi or mpiexec.mpich, or --flavour)", launcher)
}

func flavourOfName(base string) Flavour {
	switch base {
	case "orterun", "mpirun.openmpi", "mpiexec.openmpi", "oshrun":
		return OpenMPI
	case "prterun", "prun", "mpirun.prrte":
		return PRRTE
	case "mpiexec.hydra", "mpiexec.mpich", "mpirun.mpich", "mpiexec.mpich2":
		return Hydra
	case "srun":
		return Slurm
	}
	return Unknown
}

// ParseFlavour reads a --flavour value.
func ParseFlavour(s string) (Flavour, error) {
	switch strings.ToLower(s) {
	case "openmpi", "ompi", "orte":
		return OpenMPI, nil
	case "prrte", "openmpi5":
		return PRRTE, nil
	case "mpich", "hydra", "mpich-hydra":
		return Hydra, nil
	case "intel", "intel-mpi", "impi":
		return IntelMPI, nil
	case "slurm", "srun":
		return Slurm, nil
	}
	return Unknown, fmt.Errorf("unknown MPI flavour %q (want openmpi, prrte, mpich, intel or slurm)", s)
}

// lookPath is a variable so tests can fake the PATH.
var lookPath = exec.LookPath
