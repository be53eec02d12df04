package testbed

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CrossLogDir holds the iperf3 logs of `lab cross`.
func (l *Lab) CrossLogDir() string { return filepath.Join(l.dir, "cross") }

// Cross starts flows competing bulk iperf3 TCP flows from site from to site
// to with the hosts' default congestion control (StartCross with a plain
// mix).
func (l *Lab) Cross(from, to string, flows int, dur time.Duration) error {
	return l.StartCross(from, to, &CrossMix{Flows: flows, Duration: dur})
}

// StartCross starts the competing flows of m (normalized in place: the
// seed it picked is in m) from the traffic host of site from to the one of
// site to (never the MPI nodes). A bulk flow is iperf3 with its own
// one-shot server (`iperf3 -s -1`: a daemonized server kept answering
// "busy"), an on/off flow `mpi5k lab _onoff` against `mpi5k lab _sink`.
// They run detached for m.Duration; StopCross ends them earlier.
func (l *Lab) StartCross(from, to string, m *CrossMix) error {
	if !slices.Contains(l.st.Config.Sites, from) {
		return fmt.Errorf("--from: no site %q in lab %s", from, l.name)
	}
	if !slices.Contains(l.st.Config.Sites, to) {
		return fmt.Errorf("--to: no site %q in lab %s", to, l.name)
	}
	if from == to {
		return fmt.Errorf("--from and --to are the same site %q: cross traffic must cross the WAN", from)
	}
	if err := m.Normalize(); err != nil {
		return err
	}
	// Root in the traffic hosts may set any algorithm the kernel has on a
	// socket, allowed as a namespace default or not.
	for _, cc := range m.CC {
		if _, err := sysCC.check("--cc", cc); err != nil {
			return err
		}
	}
	flows := m.Flows
	src, dst := l.ExtraHosts(from)[0], l.ExtraHosts(to)[0]
	dir := l.CrossLogDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// Ports are never reused within a lab so concurrent runs do not clash.
	next := 5201
	if b, err := os.ReadFile(filepath.Join(dir, "next-port")); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			next = n
		}
	}
	if next+flows > 65000 {
		next = 5201
	}
	if err := os.WriteFile(filepath.Join(dir, "next-port"), []byte(strconv.Itoa(next+flows)), 0o644); err != nil {
		return err
	}
	secs := strconv.Itoa(int((m.Duration + time.Second - 1) / time.Second))
	daddr := l.Addr(dst).String()
	for i := 0; i < flows; i++ {
		port := strconv.Itoa(next + i)
		cc := m.FlowCC(i)
		logBase := filepath.Join(dir, port)
		if m.FlowPattern(i) == PatternOnOff {
			if err := l.spawn(dst, logBase+".sink.log", l.st.Binary, "lab", "_sink", "--name", l.name,
				"--listen", net.JoinHostPort(daddr, port), "--duration", (m.Duration + 10*time.Second).String()); err != nil {
				return err
			}
			if err := l.waitListen(dst, next+i, 3*time.Second); err != nil {
				return err
			}
			if err := l.spawn(src, logBase+".onoff.log", l.st.Binary, "lab", "_onoff", "--name", l.name,
				"--to", net.JoinHostPort(daddr, port), "--cc", cc, "--mean-size", strconv.Itoa(m.MeanSize),
				"--mean-gap", m.MeanGap.String(), "--shape", strconv.FormatFloat(m.Shape, 'g', -1, 64),
				"--seed", strconv.FormatUint(m.Seed+uint64(i), 10), "--duration", m.Duration.String()); err != nil {
				return err
			}
			continue
		}
		if err := l.spawn(dst, logBase+".server.log", "iperf3", "-s", "-1", "-B", daddr, "-p", port); err != nil {
			return err
		}
		if err := l.waitListen(dst, next+i, 3*time.Second); err != nil {
			return err
		}
		args := []string{"-c", daddr, "-p", port, "-t", secs, "-i", "0"}
		if cc != "" {
			args = append(args, "-C", cc)
		}
		if err := l.spawn(src, logBase+".client.log", "iperf3", args...); err != nil {
			return err
		}
	}
	return nil
}

// spawn starts a detached command inside host with output to logPath.
func (l *Lab) spawn(host, logPath, name string, args ...string) error {
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := l.Command(host, name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s on %s: %w", name, host, err)
	}
	go func() { _ = cmd.Wait() }() // reap if we live long enough
	return nil
}

// waitListen polls the host's TCP table until port is listening.
func (l *Lab) waitListen(host string, port int, timeout time.Duration) error {
	want := fmt.Sprintf(":%04X 00000000:0000 0A", port)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		var tab []byte
		_ = l.Do(host, func() error {
			var err error
			tab, err = os.ReadFile("/proc/thread-self/net/tcp")
			return err
		})
		if strings.Contains(string(tab), want) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("iperf3 server on %s port %d not listening after %v", host, port, timeout)
}

// StopCross kills every process running in the lab's traffic hosts and
// returns how many there were.
func (l *Lab) StopCross() (int, error) {
	var inodes [][2]uint64
	for _, h := range l.ExtraHosts("") {
		if dev, ino, ok := nsInode(l.NetNSPath(h)); ok {
			inodes = append(inodes, [2]uint64{dev, ino})
		}
	}
	pids := pidsInNamespaces(inodes)
	if len(pids) > 0 {
		killAndWait(pids)
	}
	return len(pids), nil
}

// CrossSent sums the bytes the lab's traffic hosts have sent on their
// interfaces: the competing flows of Cross, and the ACKs of the flows
// coming the other way. Two readings around a run give the competing
// flows' share of the WAN while it ran.
func (l *Lab) CrossSent() (uint64, error) {
	var sum uint64
	for _, h := range l.ExtraHosts("") {
		var dev []byte
		if err := l.Do(h, func() error {
			var err error
			dev, err = os.ReadFile("/proc/thread-self/net/dev")
			return err
		}); err != nil {
			return 0, fmt.Errorf("traffic host %s: %w", h, err)
		}
		n, err := txBytes(dev)
		if err != nil {
			return 0, fmt.Errorf("traffic host %s: /proc/net/dev: %w", h, err)
		}
		sum += n
	}
	return sum, nil
}

// txBytes sums the transmitted bytes (the ninth number of an interface's
// line) of every interface but lo in a /proc/net/dev table.
func txBytes(dev []byte) (uint64, error) {
	var sum uint64
	for _, line := range strings.Split(string(dev), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) == "lo" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 16 {
			return 0, fmt.Errorf("interface %s: %d counters, want 16", strings.TrimSpace(name), len(f))
		}
		n, err := strconv.ParseUint(f[8], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("interface %s: tx bytes %q: %w", strings.TrimSpace(name), f[8], err)
		}
		sum += n
	}
	return sum, nil
}
