// Package ratelog logs repeated events at most once per interval per
// reason, with the count of the lines it held back: a hostile or broken
// peer that triggers a refusal thousands of times a second must not flood
// the gateway's log, and the operator must still see how often it happens.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Limiter holds back repeated lines. The zero value logs at most once per
// DefaultEvery per reason.
type Limiter struct {
	Every time.Duration // default DefaultEvery

	mu   sync.Mutex
	last map[string]*entry
}

// DefaultEvery is the interval of a zero Limiter.
const DefaultEvery = 10 * time.Second

type entry struct {
	at         time.Time // when the last line went out
	suppressed int       // lines held back since then
}

// Log writes msg with args at level, unless a line of the same reason went
// out less than Every ago; then it only counts it. A line that goes out
// carries "suppressed": the lines of that reason held back before it.
func (l *Limiter) Log(log *slog.Logger, level slog.Level, reason, msg string, args ...any) bool {
	now := time.Now()
	every := l.Every
	if every <= 0 {
		every = DefaultEvery
	}
	l.mu.Lock()
	if l.last == nil {
		l.last = map[string]*entry{}
	}
	e := l.last[reason]
	if e == nil {
		e = &entry{}
		l.last[reason] = e
	} else if now.Sub(e.at) < every {
		e.suppressed++
		l.mu.Unlock()
		return false
	}
	n := e.suppressed
	e.at, e.suppressed = now, 0
	l.mu.Unlock()
	log.Log(context.Background(), level, msg, append(args, "reason", reason, "suppressed", n)...)
	return true
}
