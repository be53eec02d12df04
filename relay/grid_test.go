package relay

import (
	"testing"
	"time"
)

func TestOnGrid(t *testing.T) {
	base := time.Unix(1_700_000_000, 0) // on the grid
	for _, c := range []struct{ at, d, want time.Duration }{
		{0, time.Second, time.Second},
		{30 * time.Millisecond, time.Second, time.Second + 70*time.Millisecond},
		{30 * time.Millisecond, 250 * time.Millisecond, 270 * time.Millisecond},
		{99 * time.Millisecond, 100 * time.Millisecond, 101 * time.Millisecond},
		{30 * time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond}, // busy period: untouched
	} {
		if got := onGrid(base.Add(c.at), c.d); got != c.want {
			t.Errorf("onGrid(grid+%v, %v) = %v, want %v", c.at, c.d, got, c.want)
		}
		if end := base.Add(c.at + onGrid(base.Add(c.at), c.d)); c.d >= TimerGrid && end.UnixNano()%int64(TimerGrid) != 0 {
			t.Errorf("grid+%v, %v: ends at %v, off the grid", c.at, c.d, end)
		}
	}
}
