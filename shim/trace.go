package main

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
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
	// Written under a temporary name and renamed once the header is in:
	// a process that exits during this start-up (it runs concurrently with
	// the host's main) leaves no header-less .trace file.
	path := filepath.Join(dir, fmt.Sprintf("%s.%d.trace", host, os.Getpid()))
	tmp := path + ".tmp"
	fd, err := unix.Open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("creating %s: %w", tmp, err)
	}
	fd = highFd(fd)
	b := h.Encode(nil)
	if _, err := unix.Write(fd, b); err != nil {
		unix.Close(fd)
		unix.Unlink(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := unix.Rename(tmp, path); err != nil {
		unix.Close(fd)
		unix.Unlink(tmp)
		return fmt.Errorf("renaming %s: %w", tmp, err)
	}
	C.mpi5k_set_trace_fd(C.int(fd))
	startSampling(fd)
	go flushLoop()
	return nil
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
