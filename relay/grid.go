package relay

import "time"

// Periodic work of an idle gateway fires on a common grid.
//
// An idle gateway's timers (the WAN sampler, the PROBE_RTT guard, queue
// control, keepalives, the poller's sweep) each woke the process on its own
// phase, and each wake-up costs more than its work: a runtime thread leaves
// epoll_wait (twice, as Go rounds its timeout to milliseconds) and sysmon
// polls a few times before sleeping again. Rounded up to the next multiple
// of TimerGrid of the wall clock, the timers of a process that fall due in
// the same grid slot fire in one wake-up.

// TimerGrid is the spacing of the common grid.
const TimerGrid = 100 * time.Millisecond

// OnGrid returns how long to wait for at least d, rounded up so the wait
// ends on the grid. Periods shorter than the grid are left alone: they
// belong to busy work, where a wake-up is due anyway.
func OnGrid(d time.Duration) time.Duration {
	return onGrid(time.Now(), d)
}

func onGrid(now time.Time, d time.Duration) time.Duration {
	if d < TimerGrid {
		return d
	}
	end := now.Add(d).UnixNano()
	if r := end % int64(TimerGrid); r != 0 {
		d += TimerGrid - time.Duration(r)
	}
	return d
}
