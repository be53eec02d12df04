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

// Bad gateway tuning is refused before anything starts: the message names
// the flag and the value, then the usage hint; exit status 2.
func TestRunRejectsBadTuning(t *testing.T) {
	for _, tc := range []struct{ flag, want string }{
		{"--wan-pace=fast", `invalid argument "fast" for "--wan-pace" flag: bad rate`},
		{"--wan-notsent-lowat=lots", `invalid argument "lots" for "--wan-notsent-lowat" flag: bad size`},
		{"--chunk=1.5MiB", `invalid argument "1.5MiB" for "--chunk" flag: bad size`},
		{"--chunk=2MiB", `invalid argument "2MiB" for "--chunk" flag: size 2MiB out of range 1..1MiB`},
		{"--wan-queue=-1ms", `invalid argument "-1ms" for "--wan-queue" flag: negative duration`},
		{"--wan-rto-min=fast", `invalid argument "fast" for "--wan-rto-min" flag: bad duration`},
		{"--wan-rto-min=300ms", "--wan-rto-min 300ms out of range 0..200ms"},
		{"--wan-delack-max=-5ms", `invalid argument "-5ms" for "--wan-delack-max" flag: negative duration`},
		{"--express-max=256KiB", "--express-max 256KiB out of range 0..128KiB (the chunk, --chunk)"},
		{"--wan-pace=10kbit", "--wan-pace 10000 bit/s is below 8 kbit/s per WAN connection"},
	} {
		status, out := stderrOf(t, func() int {
			args := append(strings.Fields(tc.flag), "--wan-conns=2", "--dry-run", "mpirun", "-np", "2", "-H", "a-1.x,b-1.y", "true")
			return runMain(args)
		})
		if status != 2 || !strings.Contains(out, tc.want) || !strings.HasSuffix(out, "\nRun 'mpi5k run --help' for usage.\n") {
			t.Errorf("%s: status %d, stderr %q; want 2, %q and the usage hint", tc.flag, status, out, tc.want)
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
		for _, want := range []string{" --wan-conns=2", " --wan-skip-probe-rtt=false", " --quiet-runtime=false", " --wan-queue=2ms"} {
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
