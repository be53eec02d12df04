package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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

// Two gateways of one process: the sysctl goes off with the first and comes
// back with the last, once, however often a release is called.
func TestKeepWarmRestoresAfterLastGateway(t *testing.T) {
	p := fakeSysctl(t, "1\n")
	s1, r1, err := keepWarm()
	if err != nil || readSysctl(t, p) != "0" || !strings.Contains(s1, "set to 0") {
		t.Fatalf("first gateway: %q %v, sysctl %s", s1, err, readSysctl(t, p))
	}
	s2, r2, err := keepWarm()
	if err != nil || s2 != s1 {
		t.Fatalf("second gateway: %q %v", s2, err)
	}
	r1()
	r1()
	if v := readSysctl(t, p); v != "0" {
		t.Fatalf("restored to %s while a gateway still runs", v)
	}
	r2()
	if v := readSysctl(t, p); v != "1" {
		t.Fatalf("after the last gateway the sysctl is %s, want 1 back", v)
	}
}

func TestKeepWarmAlreadyOff(t *testing.T) {
	p := fakeSysctl(t, "0\n")
	s, r, err := keepWarm()
	if err != nil || !strings.Contains(s, "already 0") {
		t.Fatalf("%q %v", s, err)
	}
	r()
	if v := readSysctl(t, p); v != "0" {
		t.Fatalf("a sysctl we did not change became %s", v)
	}
}

// Someone else set the sysctl while the gateway ran: their value stays.
func TestKeepWarmLeavesOthersValue(t *testing.T) {
	p := fakeSysctl(t, "1\n")
	_, r, err := keepWarm()
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(p, []byte("2\n"), 0o644)
	r()
	if v := readSysctl(t, p); v != "2" {
		t.Fatalf("got %s, want the admin's 2 kept", v)
	}
}

func TestKeepWarmError(t *testing.T) {
	old := slowStartAfterIdle
	slowStartAfterIdle = filepath.Join(t.TempDir(), "missing", "tcp_slow_start_after_idle")
	defer func() { slowStartAfterIdle = old }()
	if _, r, err := keepWarm(); err == nil || r != nil || !strings.Contains(err.Error(), "net.ipv4.tcp_slow_start_after_idle") {
		t.Fatalf("err %v, release %v", err, r != nil)
	}
	// A failure leaves no user behind: the next caller starts afresh.
	p := fakeSysctl(t, "1\n")
	_, r, err := keepWarm()
	if err != nil || readSysctl(t, p) != "0" {
		t.Fatal(err)
	}
	r()
	if v := readSysctl(t, p); v != "1" {
		t.Fatalf("got %s", v)
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
		cfg := Config{WAN: SockOpts{CC: c.wan}, ExpressCC: c.express, Express: !c.noExpress}
		if got := cfg.restartsAfterIdle(); got != c.want {
			t.Errorf("--wan-cc %q --wan-express-cc %q no express %v: restarts after idle %v, want %v", c.wan, c.express, c.noExpress, got, c.want)
		}
	}
}
