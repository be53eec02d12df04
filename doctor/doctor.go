// Package doctor checks what mpi5k will and will not be able to do on a
// host, and why: kernel features, congestion controls, capabilities, the
// keep-warm sysctl, ports, peers' reachability, the shim library and the
// clock. Every check reads its inputs through Env, so tests give it fake
// /proc files and system calls; it needs no privilege.
package doctor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/mpi5k/mpi5k/tuning"
	"golang.org/x/sys/unix"
)

// Status of one check.
type Status int

const (
	OK   Status = iota
	Warn        // mpi5k runs, without a feature or slower
	Fail        // mpi5k will not run as configured
)

func (s Status) String() string { return [...]string{"OK", "WARN", "FAIL"}[s] }

// Result is one line of the report.
type Result struct {
	Status Status `json:"status"`
	Check  string `json:"check"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"` // empty for OK
}

// HostReport is one host's results ("" for this host).
type HostReport struct {
	Host    string   `json:"host"`
	Results []Result `json:"results"`
}

// MarshalText writes a status as its word (OK, WARN, FAIL).
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a status word.
func (s *Status) UnmarshalText(b []byte) error {
	for i, w := range []string{"OK", "WARN", "FAIL"} {
		if string(b) == w {
			*s = Status(i)
			return nil
		}
	}
	return fmt.Errorf("status %q: want OK, WARN or FAIL", b)
}

// Env is where the checks read the host. Local returns the real one.
type Env struct {
	ProcSys   string                  // /proc/sys
	Status    string                  // /proc/self/status
	Release   func() string           // kernel release
	SetCC     func(cc string) error   // sets a congestion control on a probe socket
	SetTimers func() error            // sets TCP_RTO_MIN_US and TCP_DELACK_MAX_US on a probe socket
	Listen    func(addr string) error // binds and closes a TCP listener
	Dial      func(addr string, d time.Duration) error
	Adjtimex  func() (state int, status int32, maxerr int64, err error)
	LookPath  func(name string) (string, error)        // a command on PATH
	Resolve   func(path string) (string, error)        // symbolic links followed
	Output    func(name string, args ...string) string // a command's output ("" if it failed)
	Stat      func(path string) error
}

// Local is the Env of this host.
func Local() Env {
	return Env{
		ProcSys: "/proc/sys",
		Status:  "/proc/self/status",
		Release: func() string {
			var u unix.Utsname
			if unix.Uname(&u) != nil {
				return "unknown"
			}
			return unix.ByteSliceToString(u.Release[:])
		},
		SetCC:     tuning.CheckCC,
		SetTimers: tuning.CheckTimers,
		Listen: func(addr string) error {
			l, err := net.Listen("tcp", addr)
			if err == nil {
				l.Close()
			}
			return err
		},
		Dial: func(addr string, d time.Duration) error {
			c, err := net.DialTimeout("tcp", addr, d)
			if err == nil {
				c.Close()
			}
			return err
		},
		Adjtimex: func() (int, int32, int64, error) {
			var tx unix.Timex // modes 0: read only
			state, err := unix.Adjtimex(&tx)
			return state, tx.Status, tx.Maxerror, err
		},
		LookPath: exec.LookPath,
		Resolve:  filepath.EvalSymlinks,
		Output: func(name string, args ...string) string {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
			if err != nil && len(out) == 0 {
				return ""
			}
			return string(out)
		},
		Stat: func(p string) error { _, err := os.Stat(p); return err },
	}
}

// Options say what to check besides the host itself.
type Options struct {
	LANPort, WANPort int      // the gateway's ports, checked free (0: skip)
	Shim             string   // libmpi5k.so path the ranks preload ("": skip)
	Reach            []string // host:port of other sites' gateways, dialled
	DialTimeout      time.Duration
	JobPorts         [2]int // the range mpi5k run draws a job's ports from (0: skip)
}

// Run performs every check.
func Run(e Env, o Options) []Result {
	var r []Result
	r = append(r, kernel(e))
	r = append(r, congestion(e)...)
	r = append(r, keepWarm(e))
	r = append(r, listenPorts(e))
	for _, p := range []struct {
		name string
		port int
	}{{"LAN port", o.LANPort}, {"WAN port", o.WANPort}} {
		if p.port > 0 {
			r = append(r, port(e, p.name, p.port))
		}
	}
	if o.JobPorts[0] > 0 {
		r = append(r, jobPorts(e, o.JobPorts[0], o.JobPorts[1]))
	}
	for _, a := range o.Reach {
		r = append(r, reach(e, a, o.DialTimeout))
	}
	if o.Shim != "" {
		r = append(r, shim(o.Shim))
	}
	if e.LookPath != nil {
		r = append(r, mpi(e), service(e))
	}
	r = append(r, clock(e))
	return r
}

// jobPorts: mpi5k run draws each job's three gateway ports from lo..hi,
// skipping busy ones; a host with few free left runs few jobs at once.
func jobPorts(e Env, lo, hi int) Result {
	const check = "job ports"
	free := 0
	for p := lo; p <= hi; p++ {
		if e.Listen(":"+strconv.Itoa(p)) == nil {
			free++
		}
	}
	detail := fmt.Sprintf("%d of %d-%d free: room for %d concurrent jobs' gateways here", free, lo, hi, free/3)
	switch {
	case free < 3:
		return Result{Fail, check, detail, fmt.Sprintf("free ports of %d-%d (ss -ltn 'sport >= :%d and sport <= :%d' lists who holds them), or give mpi5k run --lan-port/--wan-port/--metrics-port outside the range", lo, hi, lo, hi)}
	case free < 30:
		return Result{Warn, check, detail, fmt.Sprintf("ss -ltn 'sport >= :%d and sport <= :%d' lists who holds them", lo, hi)}
	}
	return Result{OK, check, detail + "; the firewall must let them through between the site's nodes, its gateway and the other gateways", ""}
}

// mpi names the MPI launchers this host has, and what the generic names
// (mpirun, mpiexec) run: mpi5k run reads a launcher's flags by its family.
func mpi(e Env) Result {
	const check = "MPI"
	var found []string
	for _, l := range []struct{ name, family, versionArg string }{
		{"mpirun.openmpi", "Open MPI", "--version"},
		{"prterun", "Open MPI 5 (PRRTE)", "--version"},
		{"mpiexec.mpich", "MPICH", "--version"},
		{"mpiexec.hydra", "MPICH (hydra)", "--version"},
		{"srun", "Slurm", "--version"},
	} {
		if _, err := e.LookPath(l.name); err != nil {
			continue
		}
		v := firstVersion(e.Output(l.name, l.versionArg))
		found = append(found, strings.TrimSpace(l.family+" "+v)+" ("+l.name+")")
	}
	for _, g := range []string{"mpirun", "mpiexec"} {
		if p, err := e.LookPath(g); err == nil {
			if real, err := e.Resolve(p); err == nil && real != p {
				fam := map[string]string{"orterun": " (Open MPI)", "mpirun.openmpi": " (Open MPI)", "prterun": " (Open MPI 5)",
					"mpiexec.hydra": " (MPICH)", "mpiexec.mpich": " (MPICH)"}[filepath.Base(real)]
				found = append(found, g+" runs "+real+fam)
			}
		}
	}
	if len(found) == 0 {
		return Result{Warn, check, "no MPI launcher on PATH (mpirun.openmpi, mpiexec.mpich, prterun, srun)",
			"rank hosts need the job's MPI: apt-get install openmpi-bin or mpich (a gateway-only host needs none)"}
	}
	return Result{OK, check, strings.Join(found, "; "), ""}
}

var versionRe = regexp.MustCompile(`\b\d+\.\d+(\.\d+)?[a-z0-9]*\b`)

// firstVersion is the first version number in a --version output.
func firstVersion(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if v := versionRe.FindString(l); v != "" {
			return v
		}
	}
	return ""
}

// service reports the installed mpi5k-gateway unit and, where systemd
// runs, its state.
func service(e Env) Result {
	const check = "service"
	unit := ""
	for _, d := range []string{"/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system", "/usr/local/lib/systemd/system"} {
		if e.Stat(d+"/mpi5k-gateway.service") == nil {
			unit = d + "/mpi5k-gateway.service"
			break
		}
	}
	if unit == "" {
		return Result{OK, check, "mpi5k-gateway.service not installed (a site's gateway hosts run it; mpi5k run starts its own gateways)", ""}
	}
	active := strings.TrimSpace(e.Output("systemctl", "is-active", "mpi5k-gateway"))
	enabled := strings.TrimSpace(e.Output("systemctl", "is-enabled", "mpi5k-gateway"))
	switch {
	case active == "active":
		return Result{OK, check, fmt.Sprintf("%s: active (%s)", unit, enabled), ""}
	case active == "failed":
		return Result{Fail, check, unit + ": failed", "journalctl -u mpi5k-gateway -p warning names why; then systemctl restart mpi5k-gateway"}
	case active == "" || strings.Contains(active, " "):
		return Result{OK, check, unit + ": installed; systemd's state unknown here (systemctl does not answer)", ""}
	}
	return Result{OK, check, fmt.Sprintf("%s: %s (%s); systemctl enable --now mpi5k-gateway starts it, once /etc/mpi5k/gateway.env names the site", unit, active, enabled), ""}
}

func (e Env) sysctl(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(e.ProcSys, strings.ReplaceAll(name, ".", "/")))
	return string(bytes.TrimSpace(b)), err
}

// Features is one line on what this host's kernel gives mpi5k, for
// --version: the release, the WAN timers, the congestion controls.
func Features(e Env) string {
	timers := "TCP_RTO_MIN_US (10 ms WAN RTO floor)"
	if err := e.SetTimers(); err != nil {
		timers = "no TCP_RTO_MIN_US (200 ms RTO floor)"
	}
	avail, _ := e.sysctl("net.ipv4.tcp_available_congestion_control")
	allowed, _ := e.sysctl("net.ipv4.tcp_allowed_congestion_control")
	return fmt.Sprintf("Linux %s: %s; congestion controls %s (allowed without CAP_NET_ADMIN: %s)", e.Release(), timers, avail, allowed)
}

// TCP_RTO_MIN_US and TCP_DELACK_MAX_US came with Linux 6.15.
func kernel(e Env) Result {
	rel := e.Release()
	err := e.SetTimers()
	switch {
	case err == nil:
		return Result{OK, "kernel", fmt.Sprintf("Linux %s: TCP_RTO_MIN_US and TCP_DELACK_MAX_US (WAN RTO floor 10 ms, delayed ACKs 5 ms)", rel), ""}
	case errors.Is(err, unix.ENOPROTOOPT):
		return Result{Warn, "kernel", fmt.Sprintf("Linux %s has no TCP_RTO_MIN_US / TCP_DELACK_MAX_US: WAN sockets keep the 200 ms RTO floor, so a lone lost message waits about 200 ms more", rel),
			"run Linux 6.15 or newer on the gateway hosts (Debian 12's 6.1 and Debian 13's 6.12 lack both options)"}
	}
	return Result{Fail, "kernel", fmt.Sprintf("Linux %s: setting TCP_RTO_MIN_US / TCP_DELACK_MAX_US: %v", rel, err), "report this kernel's answer as a bug of mpi5k"}
}

func congestion(e Env) []Result {
	avail, _ := e.sysctl("net.ipv4.tcp_available_congestion_control")
	allowed, _ := e.sysctl("net.ipv4.tcp_allowed_congestion_control")
	capAdmin, capErr := hasCap(e.Status, unix.CAP_NET_ADMIN)
	var r []Result
	denied := false
	for _, c := range []struct{ cc, role, why string }{
		{"bbr", "bulk WAN links", "without it the bulk links run the system's default (CUBIC kept 63 % of the WAN's rate in the lab where BBR kept 97-101 %)"},
		{"cubic", "express link", "without it the express link runs the bulk links' BBR, which paces messages at the rate of earlier small ones"},
	} {
		err := e.SetCC(c.cc)
		switch {
		case err == nil:
			r = append(r, Result{OK, "cc " + c.cc, fmt.Sprintf("%s can run %s (available: %s; allowed without CAP_NET_ADMIN: %s)", c.role, c.cc, avail, allowed), ""})
		case errors.Is(err, unix.EPERM):
			denied = true
			r = append(r, Result{Warn, "cc " + c.cc, fmt.Sprintf("%s cannot run %s in this process: not in net.ipv4.tcp_allowed_congestion_control (%s) and no CAP_NET_ADMIN; %s", c.role, c.cc, allowed, c.why),
				fmt.Sprintf("sysctl -w net.ipv4.tcp_allowed_congestion_control=%q, or run the gateway as the mpi5k-gateway service, whose unit grants CAP_NET_ADMIN", strings.TrimSpace(allowed+" "+c.cc))})
		case errors.Is(err, unix.ENOENT):
			r = append(r, Result{Warn, "cc " + c.cc, fmt.Sprintf("%s cannot run %s: the kernel does not offer it (available: %s); %s", c.role, c.cc, avail, c.why),
				"modprobe tcp_" + c.cc + " (and list it in /etc/modules-load.d/ to keep it)"})
		default:
			r = append(r, Result{Warn, "cc " + c.cc, err.Error(), "see the error"})
		}
	}
	capLine := Result{OK, "capabilities", "CAP_NET_ADMIN: any available congestion control can be set", ""}
	switch {
	case capErr != nil:
		capLine = Result{Warn, "capabilities", "cannot read this process's capabilities: " + capErr.Error(), "check that /proc is mounted"}
	case !capAdmin && denied:
		capLine = Result{Warn, "capabilities", fmt.Sprintf("no CAP_NET_ADMIN: congestion controls are limited to %q (see the cc lines)", allowed), "the cc lines' fix"}
	case !capAdmin:
		capLine = Result{OK, "capabilities", fmt.Sprintf("no CAP_NET_ADMIN, not needed: the congestion controls mpi5k uses are allowed (%s)", allowed), ""}
	}
	return append(r, capLine)
}

// hasCap reads the effective capability set of /proc/<pid>/status.
func hasCap(statusPath string, c int) (bool, error) {
	b, err := os.ReadFile(statusPath)
	if err != nil {
		return false, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return false, fmt.Errorf("%s: CapEff %q: %w", statusPath, v, err)
			}
			return mask&(1<<uint(c)) != 0, nil
		}
	}
	return false, fmt.Errorf("%s: no CapEff line", statusPath)
}

func keepWarm(e Env) Result {
	v, err := e.sysctl("net.ipv4.tcp_slow_start_after_idle")
	switch {
	case err != nil:
		return Result{Warn, "keep warm", "reading net.ipv4.tcp_slow_start_after_idle: " + err.Error(), "check that /proc/sys is mounted"}
	case v == "0":
		return Result{OK, "keep warm", "net.ipv4.tcp_slow_start_after_idle is 0: the CUBIC express link keeps its window across pauses", ""}
	}
	return Result{Warn, "keep warm", "net.ipv4.tcp_slow_start_after_idle is " + v + ": the CUBIC express link restarts from 10 segments after every pause longer than its RTO (a 64 KiB message after a pause: 3 round trips instead of 1)",
		tuning.KeepWarmFix + "; or run every WAN link on BBR (--wan-express-cc bbr), which Linux never restarts"}
}

// listenPorts checks that the listeners the kernel places (MPICH/UCX's,
// bound to port 0) fall in the gateways' default --lan-listen-ports,
// which registers ranks' ports only there (docs/security.md).
func listenPorts(e Env) Result {
	const check = "listen ports"
	v, err := e.sysctl("net.ipv4.ip_local_port_range")
	if err != nil {
		return Result{Warn, check, "reading net.ipv4.ip_local_port_range: " + err.Error(), "check that /proc/sys is mounted"}
	}
	lo, hi, err := portRange(v)
	if err != nil {
		return Result{Warn, check, fmt.Sprintf("net.ipv4.ip_local_port_range %q: %v", v, err), "check the sysctl"}
	}
	if lo >= defaultListenLo && hi <= defaultListenHi {
		return Result{OK, check, fmt.Sprintf("kernel-chosen ports (%d-%d) are inside the gateways' default --lan-listen-ports %d-%d", lo, hi, defaultListenLo, defaultListenHi), ""}
	}
	return Result{Warn, check, fmt.Sprintf("kernel-chosen ports (net.ipv4.ip_local_port_range %d-%d) reach outside the gateways' default --lan-listen-ports %d-%d: a rank listening there (MPICH/UCX) is not reachable from other sites", lo, hi, defaultListenLo, defaultListenHi),
		fmt.Sprintf("start this site's gateways with --lan-listen-ports %d-%d (every node alike), or set the sysctl back to %d %d", lo, hi, defaultListenLo, defaultListenHi)}
}

// The gateways' default --lan-listen-ports (gateway.DefaultListenPorts).
const defaultListenLo, defaultListenHi = 32768, 60999

func portRange(v string) (lo, hi int, err error) {
	f := strings.Fields(v)
	if len(f) != 2 {
		return 0, 0, errors.New("want two ports")
	}
	if lo, err = strconv.Atoi(f[0]); err == nil {
		hi, err = strconv.Atoi(f[1])
	}
	return lo, hi, err
}

func port(e Env, name string, p int) Result {
	addr := ":" + strconv.Itoa(p)
	err := e.Listen(addr)
	switch {
	case err == nil:
		return Result{OK, name, fmt.Sprintf("TCP %d is free", p), ""}
	case errors.Is(err, unix.EADDRINUSE):
		return Result{Fail, name, fmt.Sprintf("TCP %d is in use by another process", p), fmt.Sprintf("stop what listens there (ss -ltnp 'sport = :%d') or choose another port (mpi5k run --lan-port/--wan-port, the site map's lan=/wan=)", p)}
	case errors.Is(err, unix.EACCES):
		return Result{Fail, name, fmt.Sprintf("TCP %d: %v", p, err), "ports below 1024 need CAP_NET_BIND_SERVICE: choose a port of 1024 or above"}
	}
	return Result{Fail, name, fmt.Sprintf("TCP %d: %v", p, err), "see the error"}
}

func reach(e Env, addr string, d time.Duration) Result {
	if d <= 0 {
		d = 3 * time.Second
	}
	err := e.Dial(addr, d)
	switch {
	case err == nil:
		return Result{OK, "reach " + addr, "connected: a gateway (or something) listens there", ""}
	case errors.Is(err, unix.ECONNREFUSED):
		return Result{OK, "reach " + addr, "the host answers; nothing listens on the port yet (no gateway running)", ""}
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return Result{Fail, "reach " + addr, "cannot resolve the name: " + err.Error(),
			"check the host name's spelling and this host's resolver (getent hosts " + dns.Name + "), or give the address"}
	}
	return Result{Fail, "reach " + addr, "cannot connect: " + err.Error(), "open the WAN port between the gateway hosts (firewall), or give the gateway a WAN address the other sites can route to (the site map's wan=)"}
}

func shim(path string) Result {
	f, err := os.Open(path)
	if err != nil {
		return Result{Fail, "shim", err.Error(), "install libmpi5k.so at the same path on every rank host (make install, or the mpi5k package), or point mpi5k run --preload at it"}
	}
	defer f.Close()
	var hdr [18]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil || string(hdr[:4]) != "\x7fELF" || hdr[16] != 3 { // ET_DYN
		return Result{Fail, "shim", path + " is not an ELF shared library", "rebuild it (make) and install it again"}
	}
	return Result{OK, "shim", path + " is a shared library", ""}
}

// Kernel time status: STA_UNSYNC set means no time daemon disciplines the
// clock, and trace timestamps of different hosts drift apart.
func clock(e Env) Result {
	state, status, maxerr, err := e.Adjtimex()
	if err != nil {
		return Result{Warn, "clock", "adjtimex: " + err.Error(), "check the time daemon (chronyc tracking, timedatectl)"}
	}
	if state == unix.TIME_ERROR || status&unix.STA_UNSYNC != 0 {
		return Result{Warn, "clock", "the kernel clock is not synchronised: traces of different hosts (mpi5k trace) are merged by their timestamps",
			"run a time daemon on every host (apt-get install chrony)"}
	}
	return Result{OK, "clock", fmt.Sprintf("synchronised, maximum error %s", time.Duration(maxerr)*time.Microsecond), ""}
}

// Write prints results one a line, a fix under each that has one, and
// says whether any failed.
func Write(w io.Writer, host string, rs []Result) (failed bool) {
	for _, r := range rs {
		prefix := ""
		if host != "" {
			prefix = host + ": "
		}
		fmt.Fprintf(w, "%s%-4s %-13s %s\n", prefix, r.Status, r.Check, r.Detail)
		if r.Fix != "" {
			fmt.Fprintf(w, "%s     %-13s fix: %s\n", prefix, "", r.Fix)
		}
		failed = failed || r.Status == Fail
	}
	return failed
}
