package main

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/trace"
)

// init starts tracing when the C constructor allocated the ring (MPI5K_TRACE
// set in an enabled process). It runs on the Go runtime's start-up thread,
// after the constructor, while the host's main may already be running: C
// records into the ring from the first call and the records wait there
// until the file is ready.
func init() {
	if C.mpi5k_trace_wanted() == 0 {
		return
	}
	if err := startTrace(os.Getenv("MPI5K_TRACE")); err != nil {
		logf(levelError, "tracing off: %v", err)
	}
}

func startTrace(dir string) error {
	// A process whose site is unknown relays nothing; its trace would be
	// noise (often a shell running before the host is set up).
	c := loadOnce()
	if c == nil {
		return nil
	}
	host, _ := os.Hostname()
	mono, wall := anchor()
	h := trace.Header{
		Wall:   wall,
		Mono:   mono,
		PID:    uint32(os.Getpid()),
		Host:   host,
		SiteID: c.local.ID,
		Site:   c.local.Name,
		Rank:   launcherRank(),
	}
	fd, err := createTrace(dir, host, os.Getpid(), h.Encode(nil))
	if err != nil {
		return err
	}
	C.mpi5k_set_trace_fd(C.int(fd))
	startSampling(fd)
	go flushLoop()
	return nil
}

// traceNames is how many names a process tries for its trace: its own,
// then as many with a number, for a file of that name left by a process
// of the same pid (an exec'd image of a traced shell, a container's
// restart) or planted there.
const traceNames = 8

// createTrace creates the trace file of process pid in dir with header in
// it, and returns it open for writing. The trace directory may be shared
// (a cluster's scratch space): a file is never opened through a symlink
// and never replaces or truncates one that exists. It is written under a
// temporary name of its own, created with O_EXCL|O_NOFOLLOW, and moved to
// DIR/<host>.<pid>.trace once the header is in, so a process that exits
// during start-up leaves no header-less .trace; if that name exists, the
// next free one of <host>.<pid>.<n>.trace. The file is the owner's alone
// (0600), or readable by the directory's group (0640) in a setgid
// directory, whose group the file takes: a team's shared trace directory.
func createTrace(dir, host string, pid int, header []byte) (int, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return -1, fmt.Errorf("trace directory: %w", err)
	}
	if !st.IsDir() {
		return -1, fmt.Errorf("trace directory %s is not a directory", dir)
	}
	mode := uint32(0o600)
	if st.Mode()&os.ModeSetgid != 0 {
		mode = 0o640
	}
	host = strings.ReplaceAll(host, "/", "_")
	base := filepath.Join(dir, fmt.Sprintf("%s.%d", host, pid))
	var fd int
	var tmp string
	for try := 0; ; try++ {
		// Unpredictable enough to not be planted in advance, and drawn
		// without crypto/rand, whose fallback opens a file the process
		// would then hold (O_EXCL refuses a collision anyway).
		tmp = fmt.Sprintf("%s.trace.%x.tmp", base, uint64(time.Now().UnixNano())^rand.Uint64())
		fd, err = unix.Open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		if err == nil {
			break
		}
		if err != unix.EEXIST || try == 3 {
			return -1, fmt.Errorf("creating %s: %w", tmp, err)
		}
	}
	fd = highFd(fd)
	fail := func(err error) (int, error) {
		unix.Close(fd)
		unix.Unlink(tmp)
		return -1, err
	}
	if _, err := unix.Write(fd, header); err != nil {
		return fail(fmt.Errorf("writing %s: %w", tmp, err))
	}
	first := base + ".trace"
	for n := 0; n < traceNames; n++ {
		path := first
		if n > 0 {
			path = fmt.Sprintf("%s.%d.trace", base, n)
		}
		err := renameNoReplace(tmp, path)
		if err == nil {
			if n > 0 {
				logf(levelWarn, "%s exists (not overwritten): tracing into %s", first, path)
			}
			return fd, nil
		}
		if err != unix.EEXIST {
			return fail(fmt.Errorf("renaming %s to %s: %w", tmp, path, err))
		}
	}
	return fail(fmt.Errorf("%s and the %d names after it exist (traces of earlier processes with pid %d, or files planted there) and are not overwritten: trace into a directory of your own, or empty this one",
		first, traceNames-1, pid))
}

// renameNoReplace moves oldpath to newpath unless newpath exists (as
// anything: a symlink is not followed, it is there). A file system
// without renameat2's RENAME_NOREPLACE (some network and FUSE ones) gets
// link and unlink, which fail the same way.
func renameNoReplace(oldpath, newpath string) error {
	err := unix.Renameat2(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, unix.RENAME_NOREPLACE)
	if err != unix.EINVAL && err != unix.ENOSYS {
		return err
	}
	if err := unix.Link(oldpath, newpath); err != nil {
		return err
	}
	return unix.Unlink(oldpath)
}

// rankVars are where launchers put the MPI rank: Open MPI, MPICH/Hydra
// (PMI), PMIx launchers (PRRTE, srun --mpi=pmix), Slurm.
var rankVars = []string{"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}

// launcherRank is the process's MPI rank from its launcher's environment,
// -1 when no launcher said (or said something that is not a rank).
func launcherRank() int32 {
	for _, v := range rankVars {
		if s := os.Getenv(v); s != "" {
			if r, err := strconv.Atoi(s); err == nil && r >= 0 && r < trace.MaxRank {
				return int32(r)
			}
			logf(levelWarn, "%s=%q is not a rank; the trace records none", v, s)
			return -1
		}
	}
	return -1
}

// anchor pairs CLOCK_MONOTONIC (the records' clock) with the wall clock, read
// back to back, so analysis can place records in real time.
func anchor() (mono uint64, wall int64) {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	w := time.Now().UnixNano()
	return uint64(ts.Nano()), w
}

// flushLoop drains the ring off the hot path. Every 10 ms, the 65536-record
// ring holds 6.5 M traced calls per second before records are lost (and
// counted in a KindLost record).
func flushLoop() {
	for {
		C.mpi5k_sleep_ms(10) // not time.Sleep: see mpi5k_sleep_ms
		if C.mpi5k_trace_wanted() == 0 {
			return
		}
		C.mpi5k_trace_flush()
	}
}
