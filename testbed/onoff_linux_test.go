package testbed

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// An on/off flow against a sink on loopback: every transfer arrives whole,
// its sizes are the seeded draws in order, and a congestion control the
// kernel lacks fails each connection with a clear error.
func TestOnOffAgainstSink(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	go RunSink(addr, 5*time.Second)
	time.Sleep(50 * time.Millisecond)

	o := OnOff{Addr: addr, CC: "reno", MeanSize: 64 << 10, MeanGap: 20 * time.Millisecond, Shape: 1.5, Seed: 42, Duration: time.Second}
	var out strings.Builder
	if err := o.Run(&out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	d := newOnOffDraw(42, 64<<10, 1.5, 20*time.Millisecond)
	re := regexp.MustCompile(`^transfer (\d+): (\d+) B in `)
	n := 0
	for _, line := range lines {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n++
		want := d.size()
		d.pause()
		if got, _ := strconv.Atoi(m[2]); got != want || m[1] != fmt.Sprint(n) {
			t.Fatalf("line %q: want transfer %d of %d B (the seeded draw)", line, n, want)
		}
	}
	if n < 5 {
		t.Fatalf("%d transfers in 1 s with 20 ms gaps:\n%s", n, out.String())
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, fmt.Sprintf("done: %d transfers", n)) || !strings.Contains(last, "0 failed") {
		t.Errorf("summary %q of\n%s", last, out.String())
	}

	o.CC, o.Duration = "nosuchcc", 200*time.Millisecond
	out.Reset()
	if err := o.Run(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "congestion control nosuchcc") || !strings.Contains(out.String(), "done: 0 transfers, 0 B") {
		t.Errorf("unknown congestion control:\n%s", out.String())
	}
}
