package gateway

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// RaisePriority sets the gateway process's scheduling priority to nice.
//
// A gateway often shares its host with ranks that compute flat out (by
// default `mpi5k run` puts it on the last host of each site). Every
// message it forwards needs its thread to run at once, and a thread that
// wakes beside busy ranks of equal weight waits for the scheduler to
// preempt one of them; a latency-bound code (LU: thousands of 1 KiB
// messages in a pipeline) pays that wait per message and hop, which
// direct TCP, handled in the kernel, does not. A lower nice value lets
// the wake-up preempt at once. On the lab (4 computing ranks and both
// gateways on 2 vCPUs) nice -10 measured within the runs' spread of the
// default on every NAS-like workload (bench/figures/computework): there the
// gateways' cost is CPU, not waiting. So it is off by default, for sites
// that want to try it.
//
// Under autogroup scheduling (kernel.sched_autogroup_enabled, the default
// of Debian and most distributions) CPU is shared between sessions first,
// so the session's autogroup is what counts; it is changed only when the
// gateway leads its own session (mpi5k run and systemd start it so), never
// a shell's or a launcher's. Every thread is set too, for kernels without
// autogroups; threads started later inherit it. Lowering nice needs
// CAP_SYS_NICE or RLIMIT_NICE: without them it fails with EPERM and the
// gateway runs at its inherited priority.
func RaisePriority(nice int) error {
	if nice < -20 || nice > 19 {
		return fmt.Errorf("--priority %d out of range -20..19", nice)
	}
	if sid, err := unix.Getsid(0); err == nil && sid == unix.Getpid() {
		err := os.WriteFile("/proc/self/autogroup", []byte(strconv.Itoa(nice)), 0)
		if err != nil && !errors.Is(err, os.ErrNotExist) { // no file: no autogroups
			return fmt.Errorf("set the autogroup's nice to %d: %w", nice, err)
		}
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		// A thread that exited meanwhile is gone: ESRCH is no failure.
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil && err != unix.ESRCH {
			return fmt.Errorf("set nice %d: %w", nice, err)
		}
	}
	return nil
}
