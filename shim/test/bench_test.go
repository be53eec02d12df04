package shimtest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/trace"
)

// Benchmarks print the figures of docs/shim.md. Run them alone (2 cores are
// shared): go test -run '^$' -bench . -benchtime 1x ./shim/test

func metric(b *testing.B, out, re string) float64 {
	m := regexp.MustCompile(re).FindStringSubmatch(out)
	if m == nil {
		b.Fatalf("no %q in %q", re, out)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// BenchmarkWriteDevNull: write(1 byte) on /dev/null, an fd the shim does not
// manage: bare, bare with one idle thread (what the Go runtime's threads cost
// by themselves: the kernel's single-threaded fd fast path is lost), and
// preloaded (active, tracing off). Target: <= 20 ns added by the shim, i.e.
// preload vs bare-with-thread. Thread CPU time, best of 7.
func BenchmarkWriteDevNull(b *testing.B) {
	l := newLab(&testing.T{})
	const n = "2000000"
	bare, bareThr, pre, traced := 1e18, 1e18, 1e18, 1e18
	for i := 0; i < 7; i++ {
		bare = min(bare, metric(b, run(&testing.T{}, os.Environ(), time.Minute, "bench-write", n), `ns/op=([0-9.]+)`))
		bareThr = min(bareThr, metric(b, run(&testing.T{}, os.Environ(), time.Minute, "bench-write", n, "1"), `ns/op=([0-9.]+)`))
		pre = min(pre, metric(b, run(&testing.T{}, l.env("a"), time.Minute, "bench-write", n), `ns/op=([0-9.]+)`))
		traced = min(traced, metric(b, run(&testing.T{}, l.env("a", "MPI5K_TRACE="+b.TempDir()), time.Minute, "bench-write", n), `ns/op=([0-9.]+)`))
	}
	b.ReportMetric(bare, "bare-ns/write")
	b.ReportMetric(bareThr, "bare+thread-ns/write")
	b.ReportMetric(pre, "preload-ns/write")
	b.ReportMetric(pre-bareThr, "shim-added-ns/write")
	b.ReportMetric(traced, "tracing-on-nonsocket-ns/write")
}

// BenchmarkTracedCall: the cost of recording one call on a TCP socket
// (budget 200 ns), and whether the flusher kept up (records lost).
func BenchmarkTracedCall(b *testing.B) {
	l := newLab(&testing.T{})
	const n = 1000000
	off, on := 1e18, 1e18
	var lost, recs int
	for i := 0; i < 5; i++ {
		off = min(off, metric(b, run(&testing.T{}, l.env("a"), time.Minute, "bench-traced", fmt.Sprint(n)), `ns/op=([0-9.]+)`))
		dir := b.TempDir()
		on = min(on, metric(b, run(&testing.T{}, l.env("a", "MPI5K_TRACE="+dir), time.Minute, "bench-traced", fmt.Sprint(n)), `ns/op=([0-9.]+)`))
		recs, lost = countTrace(b, dir)
	}
	b.ReportMetric(off, "untraced-ns/send")
	b.ReportMetric(on, "traced-ns/send")
	b.ReportMetric(on-off, "trace-added-ns/call")
	b.ReportMetric(float64(lost)/float64(recs+lost)*100, "lost-%")
}

func countTrace(b *testing.B, dir string) (recs, lost int) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.trace"))
	if len(files) != 1 {
		b.Fatalf("trace files %v", files)
	}
	f, err := os.Open(files[0])
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	r, err := trace.NewReader(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		b.Fatal(err)
	}
	for {
		rec, err := r.Next()
		if err != nil {
			return recs, lost
		}
		if rec.Kind == trace.KindLost {
			lost += int(rec.Ret)
		} else {
			recs++
		}
	}
}

// BenchmarkConnect: connect()+1-byte echo+close to another site through the
// fake gateway vs the same destination without the shim.
func BenchmarkConnect(b *testing.B) {
	t := &testing.T{}
	l := newLab(t)
	port, _ := echoServer(t, "127.0.2.1:0")
	p := fmt.Sprint(port)
	dOut := run(t, os.Environ(), time.Minute, "bench-connect", "300", srcA, "127.0.2.1", p)
	rOut := run(t, l.env("a"), time.Minute, "bench-connect", "300", srcA, "127.0.2.1", p)
	direct, relayed := metric(b, dOut, `min=([0-9.]+)`), metric(b, rOut, `min=([0-9.]+)`)
	b.ReportMetric(direct, "direct-min-us/connect")
	b.ReportMetric(relayed, "relayed-min-us/connect")
	b.ReportMetric(relayed-direct, "added-min-us/connect")
	b.ReportMetric(metric(b, dOut, `mean=([0-9.]+)`), "direct-mean-us/connect")
	b.ReportMetric(metric(b, rOut, `mean=([0-9.]+)`), "relayed-mean-us/connect")
}

// BenchmarkStartup: exec of a C program that does nothing, bare, preloaded
// without a map (passive) and preloaded with a map (active).
func BenchmarkStartup(b *testing.B) {
	l := newLab(&testing.T{})
	envs := map[string][]string{
		"bare":    os.Environ(),
		"passive": append(os.Environ(), "LD_PRELOAD="+libPath),
		"active":  l.env("a"),
	}
	res := map[string]float64{}
	for _, name := range []string{"bare", "passive", "active"} {
		best := time.Duration(1 << 62)
		for i := 0; i < 200; i++ {
			cmd := exec.Command(progPath, "nop")
			cmd.Env = envs[name]
			t0 := time.Now()
			if err := cmd.Run(); err != nil {
				b.Fatal(err)
			}
			best = min(best, time.Since(t0))
		}
		res[name] = float64(best.Microseconds())
		out, _ := exec.Command(progPath, "status").Output()
		cmd := exec.Command(progPath, "status")
		cmd.Env = envs[name]
		out, _ = cmd.Output()
		b.Logf("%s: %q", name, out)
	}
	b.ReportMetric(res["bare"], "bare-us/exec")
	b.ReportMetric(res["passive"]-res["bare"], "passive-added-us/exec")
	b.ReportMetric(res["active"]-res["bare"], "active-added-us/exec")
}
