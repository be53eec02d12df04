package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	l := Limiter{Every: 50 * time.Millisecond}
	for range 100 {
		l.Log(log, slog.LevelWarn, "a", "refused")
	}
	l.Log(log, slog.LevelWarn, "b", "other")
	if n := strings.Count(buf.String(), "\n"); n != 2 {
		t.Fatalf("got %d lines for 100 of reason a and 1 of b, want 2:\n%s", n, buf.String())
	}
	time.Sleep(60 * time.Millisecond)
	l.Log(log, slog.LevelWarn, "a", "refused")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[2], "suppressed=99") {
		t.Fatalf("after the interval: want a third line with suppressed=99, got:\n%s", buf.String())
	}
}
