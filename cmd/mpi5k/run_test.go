package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

// stderrOf runs f with os.Stderr captured.
func stderrOf(t *testing.T, f func() int) (int, string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	status := f()
	os.Stderr = old
	w.Close()
	b, _ := io.ReadAll(r)
	return status, string(b)
}

// Bad gateway tuning is refused before anything starts: one line naming
// the flag, exit status 2.
func TestRunRejectsBadTuning(t *testing.T) {
	for flag, want := range map[string]string{
		"--wan-pace=fast":          "--wan-pace: bad rate",
		"--wan-notsent-lowat=lots": "--wan-notsent-lowat: bad size",
		"--chunk=1.5MiB":           "--chunk: bad size",
		"--wan-queue=-1ms":         "--wan-queue: bad duration",
		"--wan-rto-min=fast":       "--wan-rto-min: bad duration",
		"--wan-delack-max=-5ms":    "--wan-delack-max: bad duration",
	} {
		status, out := stderrOf(t, func() int {
			return runMain([]string{flag, "--dry-run", "mpirun", "-np", "2", "-H", "a-1.x,b-1.y", "true"})
		})
		if status != 2 || !strings.Contains(out, want) || strings.Count(out, "\n") != 1 {
			t.Errorf("%s: status %d, stderr %q; want 2 and one line with %q", flag, status, out, want)
		}
	}
}

func TestParseGWMode(t *testing.T) {
	m, err := parseGWMode("paced= --wan-pace 190mbit --wan-cc cubic ")
	if err != nil || m.Name != "paced" || m.Kind != "gateways" || strings.Join(m.Args, " ") != "--wan-pace 190mbit --wan-cc cubic" {
		t.Errorf("good mode: %+v %v", m, err)
	}
	for _, bad := range []string{"k4", "=--wan-conns 4", "k 4=--wan-conns 4", "k4=", "k4=wan-conns 4"} {
		if _, err := parseGWMode(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Gateway tuning reaches both gateways' command lines (--dry-run prints
// them on stdout), booleans only when they differ from the default.
func TestRunPassesGatewayTuning(t *testing.T) {
	dir := t.TempDir()
	sites := dir + "/sites"
	if err := os.WriteFile(sites, []byte("127.0.0.2 x\n127.0.0.3 y\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	status := runMain([]string{"--sites", sites, "--workdir", dir + "/work", "--wan-conns", "2", "--wan-skip-probe-rtt=false", "--quiet-runtime=false",
		"--wan-queue", "2ms", "--dry-run", "mpirun", "-np", "2", "-H", "127.0.0.2,127.0.0.3", "true"})
	os.Stdout = old
	w.Close()
	b, _ := io.ReadAll(r)
	if status != 0 {
		t.Fatalf("dry run: status %d\n%s", status, b)
	}
	var gws int
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, "mpi5k-gateway ") {
			continue
		}
		gws++
		for _, want := range []string{" --wan-conns 2", " --wan-skip-probe-rtt=false", " --quiet-runtime=false", " --wan-queue 2ms"} {
			if !strings.Contains(line, want) {
				t.Errorf("gateway command lacks %q: %s", want, line)
			}
		}
		if strings.Contains(line, "--poll-thread") || strings.Contains(line, "--wan-express-renew") {
			t.Errorf("default booleans passed on: %s", line)
		}
	}
	if gws != 2 {
		t.Errorf("%d gateway commands in the dry run, want 2:\n%s", gws, b)
	}
}
