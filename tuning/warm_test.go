package tuning

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeSysctl points keepWarm at a file holding v for the test's duration.
func fakeSysctl(t *testing.T, v string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tcp_slow_start_after_idle")
	if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
		t.Fatal(err)
	}
	old := slowStartAfterIdle
	slowStartAfterIdle = p
	t.Cleanup(func() { slowStartAfterIdle = old })
	return p
}

func readSysctl(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// WarmState only reads: the value it finds is the value left.
func TestWarmStateReadsOnly(t *testing.T) {
	for _, c := range []struct {
		v, state string
		warm     bool
	}{
		{"0\n", "tcp_slow_start_after_idle is 0", true},
		{"1\n", "cold: tcp_slow_start_after_idle is 1", false},
		{"2", "cold: tcp_slow_start_after_idle is 2", false},
	} {
		p := fakeSysctl(t, c.v)
		warm, state, err := WarmState()
		if err != nil || warm != c.warm || state != c.state {
			t.Errorf("sysctl %q: warm %v state %q err %v, want %v %q", c.v, warm, state, err, c.warm, c.state)
		}
		if got := readSysctl(t, p); got != strings.TrimSpace(c.v) {
			t.Errorf("sysctl %q became %q", c.v, got)
		}
	}
}

func TestWarmStateError(t *testing.T) {
	old := slowStartAfterIdle
	slowStartAfterIdle = filepath.Join(t.TempDir(), "missing", "tcp_slow_start_after_idle")
	defer func() { slowStartAfterIdle = old }()
	if _, _, err := WarmState(); err == nil || !strings.Contains(err.Error(), "net.ipv4.tcp_slow_start_after_idle") {
		t.Fatalf("err %v, want one naming the sysctl", err)
	}
}

// Only a WAN socket that is not BBR needs the sysctl: Linux never restarts
// a BBR socket after idle.
func TestRestartsAfterIdle(t *testing.T) {
	for _, c := range []struct {
		wan, express string
		noExpress    bool
		want         bool
	}{
		{"bbr", "bbr", false, false},
		{"bbr", "", false, false}, // the express link is created with the WAN CC
		{"bbr", "cubic", false, true},
		{"bbr", "cubic", true, false}, // no express link
		{"cubic", "bbr", false, true},
		{"", "", false, true}, // the system's default may be CUBIC
	} {
		if got := RestartsAfterIdle(c.wan, c.express, !c.noExpress); got != c.want {
			t.Errorf("--wan-cc %q --wan-express-cc %q no express %v: restarts after idle %v, want %v", c.wan, c.express, c.noExpress, got, c.want)
		}
	}
}

// A CC the kernel offers but does not allow without CAP_NET_ADMIN: the
// error names the sysctl, what it holds and the command that fixes it.
func TestCCErrorNotAllowed(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tcp_allowed_congestion_control"), []byte("reno cubic\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "tcp_available_congestion_control"), []byte("reno bbr cubic\n"), 0o644)
	old := procSysIPv4
	procSysIPv4 = dir
	defer func() { procSysIPv4 = old }()
	err := ccError("bbr", unix.EPERM)
	for _, want := range []string{`"bbr"`, `net.ipv4.tcp_allowed_congestion_control is "reno cubic"`, "CAP_NET_ADMIN",
		`sysctl -w net.ipv4.tcp_allowed_congestion_control="reno cubic bbr"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v: want it to say %s", err, want)
		}
	}
	if !errors.Is(err, unix.EPERM) {
		t.Errorf("error %v does not wrap EPERM", err)
	}
	err = ccError("vegas", unix.ENOENT)
	if err == nil || !strings.Contains(err.Error(), `tcp_available_congestion_control is "reno bbr cubic"`) || !strings.Contains(err.Error(), "modprobe tcp_vegas") {
		t.Errorf("unknown CC: %v", err)
	}
	if !errors.Is(err, unix.ENOENT) {
		t.Errorf("error %v does not wrap ENOENT", err)
	}
}
