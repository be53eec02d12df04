package doctor

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/gateway"
)

// host is a fake host: sysctls, CapEff and the answers of its system calls.
type host struct {
	sysctls map[string]string
	capEff  string
	timers  error
	cc      map[string]error
	listen  map[string]error
	dial    map[string]error
	unsync  bool
}

func (h host) env(t *testing.T) Env {
	dir := t.TempDir()
	for k, v := range h.sysctls {
		p := filepath.Join(dir, "sys", strings.ReplaceAll(k, ".", "/"))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(v+"\n"), 0o644)
	}
	status := filepath.Join(dir, "status")
	os.WriteFile(status, []byte("Name:\tmpi5k\nCapInh:\t0000000000000000\nCapEff:\t"+h.capEff+"\nCapBnd:\t000001ffffffffff\n"), 0o644)
	return Env{
		ProcSys:   filepath.Join(dir, "sys"),
		Status:    status,
		Release:   func() string { return "6.1.0-test" },
		SetCC:     func(cc string) error { return h.cc[cc] },
		SetTimers: func() error { return h.timers },
		Listen:    func(a string) error { return h.listen[a] },
		Dial:      func(a string, _ time.Duration) error { return h.dial[a] },
		Adjtimex: func() (int, int32, int64, error) {
			if h.unsync {
				return unix.TIME_ERROR, unix.STA_UNSYNC, 16000000, nil
			}
			return unix.TIME_OK, 0, 2500, nil
		},
	}
}

func find(t *testing.T, rs []Result, check string) Result {
	t.Helper()
	for _, r := range rs {
		if r.Check == check {
			return r
		}
	}
	t.Fatalf("no %q check in %+v", check, rs)
	return Result{}
}

// expect checks one result's status and that its detail and fix hold the
// given texts.
func expect(t *testing.T, rs []Result, check string, st Status, texts ...string) {
	t.Helper()
	r := find(t, rs, check)
	if r.Status != st {
		t.Errorf("%s: %v, want %v: %s", check, r.Status, st, r.Detail)
	}
	for _, s := range texts {
		if !strings.Contains(r.Detail+" fix: "+r.Fix, s) {
			t.Errorf("%s: %q / fix %q lacks %q", check, r.Detail, r.Fix, s)
		}
	}
	if (st == OK) != (r.Fix == "") {
		t.Errorf("%s: status %v with fix %q: a fix goes with WARN and FAIL only", check, st, r.Fix)
	}
}

func elf(t *testing.T, typ byte) string {
	p := filepath.Join(t.TempDir(), "libmpi5k.so")
	b := make([]byte, 64)
	copy(b, "\x7fELF")
	b[16] = typ
	os.WriteFile(p, b, 0o644)
	return p
}

// Debian 12 as a user would find it: 6.1, BBR available but not allowed,
// slow start after idle on, a port taken, a firewalled peer, no time
// daemon, no shim.
func TestDebian12NonRoot(t *testing.T) {
	h := host{
		sysctls: map[string]string{
			"net.ipv4.tcp_available_congestion_control": "reno bbr cubic",
			"net.ipv4.tcp_allowed_congestion_control":   "reno cubic",
			"net.ipv4.tcp_slow_start_after_idle":        "1",
			"net.ipv4.ip_local_port_range":              "10000 65000",
		},
		capEff: "0000000000000000",
		timers: unix.ENOPROTOOPT,
		cc:     map[string]error{"bbr": unix.EPERM},
		listen: map[string]error{":5000": unix.EADDRINUSE},
		dial: map[string]error{"gw.rennes:5001": errors.New("dial tcp 10.0.0.2:5001: i/o timeout"), "gw.lyon:5001": unix.ECONNREFUSED,
			"gw.nowhere:5001": &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "gw.nowhere", IsNotFound: true}}},
		unsync: true,
	}
	rs := Run(h.env(t), Options{LANPort: 5000, WANPort: 5001, Shim: filepath.Join(t.TempDir(), "missing.so"), Reach: []string{"gw.rennes:5001", "gw.lyon:5001", "gw.nowhere:5001"}})
	expect(t, rs, "kernel", Warn, "Linux 6.1.0-test has no TCP_RTO_MIN_US", "Linux 6.15 or newer")
	expect(t, rs, "cc bbr", Warn, "(reno cubic)", `sysctl -w net.ipv4.tcp_allowed_congestion_control="reno cubic bbr"`, "CAP_NET_ADMIN")
	expect(t, rs, "cc cubic", OK)
	expect(t, rs, "capabilities", Warn, "no CAP_NET_ADMIN")
	expect(t, rs, "keep warm", Warn, "is 1", "sysctl -w net.ipv4.tcp_slow_start_after_idle=0", "mpi5k-gateway service")
	expect(t, rs, "listen ports", Warn, "10000-65000", "--lan-listen-ports 10000-65000")
	expect(t, rs, "LAN port", Fail, "TCP 5000 is in use", "ss -ltnp")
	expect(t, rs, "WAN port", OK, "TCP 5001 is free")
	expect(t, rs, "reach gw.rennes:5001", Fail, "i/o timeout", "firewall")
	expect(t, rs, "reach gw.lyon:5001", OK, "nothing listens")
	expect(t, rs, "reach gw.nowhere:5001", Fail, "cannot resolve the name", "getent hosts gw.nowhere")
	if strings.Contains(find(t, rs, "reach gw.nowhere:5001").Fix, "firewall") {
		t.Error("a name that does not resolve gets the firewall fix")
	}
	expect(t, rs, "shim", Fail, "no such file", "same path on every rank host")
	expect(t, rs, "clock", Warn, "not synchronised", "chrony")
	var b strings.Builder
	if !Write(&b, "gw.nancy", rs) {
		t.Error("Write: a FAIL line and failed false")
	}
	if !strings.Contains(b.String(), "gw.nancy: FAIL LAN port      TCP 5000 is in use") ||
		!strings.Contains(b.String(), "gw.nancy:      ") {
		t.Errorf("report:\n%s", b.String())
	}
}

// A host set up as the docs say: every check OK, nothing to fix.
func TestReadyHost(t *testing.T) {
	h := host{
		sysctls: map[string]string{
			"net.ipv4.tcp_available_congestion_control": "reno bbr cubic",
			"net.ipv4.tcp_allowed_congestion_control":   "reno cubic",
			"net.ipv4.tcp_slow_start_after_idle":        "0",
			"net.ipv4.ip_local_port_range":              "32768\t60999",
		},
		capEff: "0000000000001000", // CAP_NET_ADMIN, as the unit grants
	}
	rs := Run(h.env(t), Options{LANPort: 5000, WANPort: 5001, Shim: elf(t, 3), Reach: []string{"gw.rennes:5001"}})
	for _, r := range rs {
		if r.Status != OK {
			t.Errorf("%s: %v %s (fix %s)", r.Check, r.Status, r.Detail, r.Fix)
		}
	}
	expect(t, rs, "capabilities", OK, "CAP_NET_ADMIN: any available")
	expect(t, rs, "clock", OK, "maximum error 2.5ms")
	if Write(&strings.Builder{}, "", rs) {
		t.Error("Write says failed with every check OK")
	}
}

func TestShimNotLibrary(t *testing.T) {
	if r := shim(elf(t, 2)); r.Status != Fail || !strings.Contains(r.Detail, "not an ELF shared library") {
		t.Errorf("an executable taken for the shim: %+v", r)
	}
}

func TestCapEff(t *testing.T) {
	p := filepath.Join(t.TempDir(), "status")
	for _, c := range []struct {
		content string
		want    bool
		err     bool
	}{
		{"CapEff:\t000001ffffffffff\n", true, false},
		{"CapEff:\t0000000000000400\n", false, false}, // CAP_NET_BIND_SERVICE only
		{"CapEff:\tzz\n", false, true},
		{"Name:\tx\n", false, true},
	} {
		os.WriteFile(p, []byte(c.content), 0o644)
		got, err := hasCap(p, unix.CAP_NET_ADMIN)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("%q: %v %v, want %v error %v", c.content, got, err, c.want, c.err)
		}
	}
}

// The listen ports check knows the gateways' default.
func TestListenPortsDefault(t *testing.T) {
	if got, want := gateway.DefaultListenPorts.String(), fmt.Sprintf("%d-%d", defaultListenLo, defaultListenHi); got != want {
		t.Errorf("gateway.DefaultListenPorts %s, the doctor checks against %s", got, want)
	}
}

// TestMPIServicePorts: the MPI launchers found and what the generic names
// run; the service's state as systemctl tells it; the job port range.
func TestMPIServicePorts(t *testing.T) {
	h := host{sysctls: map[string]string{"net.ipv4.ip_local_port_range": "32768\t60999"}, capEff: "0000000000000000",
		listen: map[string]error{":5000": unix.EADDRINUSE, ":5001": unix.EADDRINUSE}}
	e := h.env(t)
	paths := map[string]string{"mpirun.openmpi": "/usr/bin/mpirun.openmpi", "mpiexec.mpich": "/usr/bin/mpiexec.mpich", "mpiexec": "/usr/bin/mpiexec"}
	e.LookPath = func(n string) (string, error) {
		if p, ok := paths[n]; ok {
			return p, nil
		}
		return "", errors.New("not found")
	}
	e.Resolve = func(p string) (string, error) {
		if p == "/usr/bin/mpiexec" {
			return "/usr/bin/orterun", nil
		}
		return p, nil
	}
	active := "failed\n"
	e.Output = func(name string, args ...string) string {
		switch {
		case name == "mpirun.openmpi":
			return "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
		case name == "mpiexec.mpich":
			return "HYDRA build details:\n    Version:                                 4.0.2\n"
		case name == "systemctl" && args[0] == "is-active":
			return active
		case name == "systemctl":
			return "enabled\n"
		}
		return ""
	}
	e.Stat = func(p string) error {
		if p == "/lib/systemd/system/mpi5k-gateway.service" {
			return nil
		}
		return os.ErrNotExist
	}
	rs := Run(e, Options{JobPorts: [2]int{5000, 5005}})
	expect(t, rs, "MPI", OK, "Open MPI 4.1.4 (mpirun.openmpi)", "MPICH 4.0.2 (mpiexec.mpich)", "mpiexec runs /usr/bin/orterun (Open MPI)")
	expect(t, rs, "service", Fail, "/lib/systemd/system/mpi5k-gateway.service: failed", "journalctl -u mpi5k-gateway -p warning")
	expect(t, rs, "job ports", Warn, "4 of 5000-5005 free: room for 1 concurrent jobs", "ss -ltn")
	active = "active\n"
	expect(t, Run(e, Options{}), "service", OK, "active (enabled)")
	paths = nil
	expect(t, Run(e, Options{}), "MPI", Warn, "no MPI launcher on PATH", "apt-get install openmpi-bin or mpich")
	h.listen = map[string]error{":5000": unix.EADDRINUSE, ":5001": unix.EADDRINUSE, ":5002": unix.EADDRINUSE, ":5003": unix.EADDRINUSE}
	e.Listen = func(a string) error { return h.listen[a] }
	expect(t, Run(e, Options{JobPorts: [2]int{5000, 5004}}), "job ports", Fail, "1 of 5000-5004 free", "ss -ltn")
}
