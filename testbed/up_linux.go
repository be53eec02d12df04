package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Binary finds bin/mpi5k: $MPI5K_BIN, the running executable if it is
// mpi5k, bin/mpi5k in the current directory or a parent (tests run from a
// package directory), then PATH.
func Binary() (string, error) {
	if b := os.Getenv("MPI5K_BIN"); b != "" {
		if _, err := os.Stat(b); err != nil {
			return "", fmt.Errorf("MPI5K_BIN: %w", err)
		}
		return filepath.Abs(b)
	}
	if exe, err := os.Executable(); err == nil && filepath.Base(exe) == "mpi5k" {
		return exe, nil
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			p := filepath.Join(d, "bin", "mpi5k")
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				return p, nil
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	if p, err := exec.LookPath("mpi5k"); err == nil {
		return filepath.Abs(p)
	}
	return "", errors.New("cannot find the mpi5k binary (run `make`, or set MPI5K_BIN)")
}

// Up builds a lab and starts its WAN emulator. On failure everything built
// so far is removed.
func Up(ctx context.Context, c Config) (*Lab, error) {
	if os.Geteuid() != 0 {
		return nil, errNotRoot
	}
	if err := c.Normalize(); err != nil {
		return nil, err
	}
	var notes []string
	// A crash may have left algorithms added for labs that are gone.
	if note, err := sysCC.settle(""); err != nil {
		return nil, err
	} else if note != "" {
		notes = append(notes, note)
	}
	if note, err := sysCC.check("--host-cc", c.HostCC); err != nil {
		return nil, err
	} else if note != "" {
		notes = append(notes, note)
	}
	if lanLossScript(&c, planHosts(&c)) != "" {
		if _, err := exec.LookPath("nft"); err != nil {
			return nil, errNoNft
		}
	}
	if c.Seed == 0 {
		// Recorded in lab.json: a restarted emulator and `lab stats` see
		// it, and `lab up --seed` repeats the run's random choices.
		c.Seed = uint64(time.Now().UnixNano())
	}
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir := labDir(c.Name)
	if _, err := os.Stat(dir); err == nil {
		return nil, fmt.Errorf("lab %q already exists (%s): run `mpi5k lab down --name %s` first", c.Name, dir, c.Name)
	}
	l := newLab(state{Config: c, Binary: bin})
	l.notes = notes
	if err := l.build(ctx); err != nil {
		if derr := Down(c.Name); derr != nil {
			err = fmt.Errorf("%w (and cleanup failed: %v)", err, derr)
		}
		return nil, err
	}
	return l, nil
}

func (l *Lab) build(ctx context.Context) error {
	c := &l.st.Config
	for _, d := range []string{l.dir, filepath.Join(l.dir, "uts"), l.AgentDir(), netnsDir(l.name)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// Record every namespace before it exists so Down finds it after a crash.
	l.st.Namespaces = []string{routerNS(l.name)}
	for _, h := range l.hosts {
		l.st.Namespaces = append(l.st.Namespaces, nsName(l.name, h.Name))
	}
	if err := l.saveState(); err != nil {
		return err
	}
	// After lab.json, which names the need: another lab's settling must
	// not take the algorithm away in between.
	note, err := sysCC.hold(l.name, c.HostCC)
	if err != nil {
		return err
	}
	if note != "" {
		l.notes = append(l.notes, note)
	}
	if err := os.WriteFile(l.HostsFilePath(), []byte(hostsFile(c, l.hosts)), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(l.ResolvConfPath(), []byte(resolvConf), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(l.SiteMapPath(), []byte(siteMap(c, l.hosts)), 0o644); err != nil {
		return err
	}
	agent := fmt.Sprintf("#!/bin/sh\n# ssh stand-in of mpi5k lab %s: runs the command inside a lab host.\nexec %s lab _ssh --name %s \"$@\"\n",
		l.name, shellQuote(l.st.Binary), l.name)
	if err := os.WriteFile(filepath.Join(l.AgentDir(), "ssh"), []byte(agent), 0o755); err != nil {
		return err
	}

	rpath := filepath.Join(netnsDir(l.name), routerNS(l.name))
	if err := createNamedNS(rpath, "", routerNS(l.name)); err != nil {
		return err
	}
	// default/* first so every interface created later inherits rp_filter=0
	// (packets come back from TUN devices with "foreign" sources).
	if err := writeSysctls(rpath, [][2]string{
		{"net/ipv4/conf/all/rp_filter", "0"}, {"net/ipv4/conf/default/rp_filter", "0"},
		{"net/ipv4/ip_forward", "1"}, {"net/ipv4/conf/all/forwarding", "1"},
		{"net/ipv6/conf/all/disable_ipv6", "1"}, {"net/ipv6/conf/default/disable_ipv6", "1"},
	}); err != nil {
		return err
	}
	rh, err := netlinkIn(rpath)
	if err != nil {
		return err
	}
	defer rh.Close()
	if err := linkUp(rh, "lo"); err != nil {
		return err
	}
	bridges := map[int]int{}
	for i := range c.Sites {
		k := i + 1
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName(k), MTU: c.LinkMTU()}}
		if err := rh.LinkAdd(br); err != nil {
			return fmt.Errorf("bridge %s: %w", br.Name, err)
		}
		if err := addAddr(rh, br.Name, netip.PrefixFrom(routerLAN(k), 24)); err != nil {
			return err
		}
		if err := linkUp(rh, br.Name); err != nil {
			return err
		}
		lk, err := rh.LinkByName(br.Name)
		if err != nil {
			return err
		}
		bridges[k] = lk.Attrs().Index
	}
	for i := range l.hosts {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := l.buildHost(rh, &l.hosts[i], bridges[l.hosts[i].SiteIdx]); err != nil {
			return fmt.Errorf("host %s: %w", l.hosts[i].Name, err)
		}
	}
	if c.LinkMTU() > c.MTU {
		// A bridge takes the smallest MTU of its ports as they join, unless
		// its MTU is set after: the routers' bridges carry the traffic
		// hosts' jumbo frames, or the far one would send the senders an
		// ICMP "fragmentation needed" and their path MTU would be MTU.
		for k := range bridges {
			lk, err := rh.LinkByName(bridgeName(k))
			if err == nil {
				err = rh.LinkSetMTU(lk, c.LinkMTU())
			}
			if err != nil {
				return fmt.Errorf("bridge %s: MTU %d: %w", bridgeName(k), c.LinkMTU(), err)
			}
		}
	}
	if err := l.buildRouting(rh); err != nil {
		return err
	}
	if err := l.startEmulator(ctx); err != nil {
		return err
	}
	if err := l.calibrate(ctx); err != nil {
		return err
	}
	if err := l.applyLANLoss(); err != nil {
		return err
	}
	l.st.Ready = true
	return l.saveState()
}

func (l *Lab) buildHost(rh *netlink.Handle, h *hostPlan, bridgeIdx int) error {
	c := &l.st.Config
	hpath := l.NetNSPath(h.Name)
	if err := createNamedNS(hpath, l.utsPath(h.Name), h.Name); err != nil {
		return err
	}
	sysctls := [][2]string{{"net/ipv6/conf/all/disable_ipv6", "1"}, {"net/ipv6/conf/default/disable_ipv6", "1"}}
	if cc := l.st.Config.HostCC; cc != "" {
		sysctls = append(sysctls, [2]string{"net/ipv4/tcp_congestion_control", cc})
	}
	if h.Kind == kindGateway {
		// A gateway host is set up as the mpi5k-gateway service unit sets
		// up a site's gateway host (dist/): the CUBIC express link keeps its
		// window across an MPI job's pauses. The gateways themselves change
		// no host setting; the lab's node hosts keep the kernel's 1.
		sysctls = append(sysctls, [2]string{"net/ipv4/tcp_slow_start_after_idle", "0"})
	}
	if err := writeSysctls(hpath, sysctls); err != nil {
		return err
	}
	hns, err := netns.GetFromPath(hpath)
	if err != nil {
		return err
	}
	defer hns.Close()
	hh, err := netlink.NewHandleAt(hns)
	if err != nil {
		return err
	}
	defer hh.Close()
	if err := linkUp(hh, "lo"); err != nil {
		return err
	}
	// Both veth ends are created from the router namespace: nothing ever
	// appears in the machine's own namespace.
	mtu := c.MTU
	if h.Kind == kindExtra {
		mtu = c.LinkMTU()
	}
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: h.RtrPort, MTU: mtu, MasterIndex: bridgeIdx},
		PeerName: "eth0", PeerNamespace: netlink.NsFd(int(hns)), PeerMTU: uint32(mtu)}
	if err := rh.LinkAdd(v); err != nil {
		return fmt.Errorf("veth %s: %w", h.RtrPort, err)
	}
	if err := linkUp(rh, h.RtrPort); err != nil {
		return err
	}
	if err := addAddr(hh, "eth0", netip.PrefixFrom(h.LAN, 24)); err != nil {
		return err
	}
	if err := linkUp(hh, "eth0"); err != nil {
		return err
	}
	if c.LANRate > 0 {
		if err := addTBF(hh, "eth0", c.LANRate, mtu); err != nil {
			return err
		}
		if err := addTBF(rh, h.RtrPort, c.LANRate, mtu); err != nil {
			return err
		}
	}
	eth0, err := hh.LinkByName("eth0")
	if err != nil {
		return err
	}
	// Default route to the router: other sites, and anything else ends
	// unreachable inside the lab (the router has no default route).
	if err := hh.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.IP(routerLAN(h.SiteIdx).AsSlice())}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	if h.WAN.IsValid() {
		w := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: h.RtrWAN, MTU: c.MTU},
			PeerName: "eth1", PeerNamespace: netlink.NsFd(int(hns)), PeerMTU: uint32(c.MTU)}
		if err := rh.LinkAdd(w); err != nil {
			return fmt.Errorf("veth %s: %w", h.RtrWAN, err)
		}
		// The router's end of the first gateway's WAN leg holds the
		// site's WAN subnet; a further gateway's (lab up --gateways) holds
		// the same router address alone, with a route to that gateway:
		// two interfaces on one subnet would send its packets to either.
		rtrBits := 24
		if h.Index > 1 {
			rtrBits = 32
		}
		if err := addAddr(rh, h.RtrWAN, netip.PrefixFrom(routerWAN(h.SiteIdx), rtrBits)); err != nil {
			return err
		}
		if err := linkUp(rh, h.RtrWAN); err != nil {
			return err
		}
		if h.Index > 1 {
			rw, err := rh.LinkByName(h.RtrWAN)
			if err != nil {
				return err
			}
			if err := rh.RouteAdd(&netlink.Route{LinkIndex: rw.Attrs().Index, Dst: ipNet(netip.PrefixFrom(h.WAN, 32)),
				Scope: netlink.SCOPE_LINK}); err != nil {
				return fmt.Errorf("route to %s: %w", h.WAN, err)
			}
		}
		if err := addAddr(hh, "eth1", netip.PrefixFrom(h.WAN, 24)); err != nil {
			return err
		}
		if err := linkUp(hh, "eth1"); err != nil {
			return err
		}
		eth1, err := hh.LinkByName("eth1")
		if err != nil {
			return err
		}
		// Peer gateways' WAN legs are reached over this gateway's WAN leg.
		dst := netip.MustParsePrefix(WANCIDR)
		if err := hh.RouteAdd(&netlink.Route{LinkIndex: eth1.Attrs().Index, Dst: ipNet(dst),
			Gw: net.IP(routerWAN(h.SiteIdx).AsSlice())}); err != nil {
			return fmt.Errorf("WAN route: %w", err)
		}
	}
	return nil
}

// buildRouting adds the policy rules (by incoming interface) and, per site,
// a table whose routes to other sites end "unreachable" until the emulator
// adds the TUN routes in front of them: if the emulator dies, traffic
// stops instead of silently bypassing the emulated WAN.
func (l *Lab) buildRouting(rh *netlink.Handle) error {
	c := &l.st.Config
	for i := range c.Sites {
		k := i + 1
		iifs := []string{bridgeName(k)}
		for _, h := range l.hosts {
			if h.SiteIdx == k && h.RtrWAN != "" {
				iifs = append(iifs, h.RtrWAN)
			}
		}
		for n, iif := range iifs {
			r := netlink.NewRule()
			r.IifName = iif
			r.Table = tableFor(k)
			r.Priority = 1000 + 10*k + n
			if err := rh.RuleAdd(r); err != nil {
				return fmt.Errorf("rule iif %s: %w", iif, err)
			}
		}
		for j := range c.Sites {
			if j == i {
				continue
			}
			for _, p := range []netip.Prefix{siteLAN(j + 1), siteWAN(j + 1)} {
				rt := &netlink.Route{Dst: ipNet(p), Table: tableFor(k), Type: unix.RTN_UNREACHABLE, Priority: 1000}
				if err := rh.RouteAdd(rt); err != nil {
					return fmt.Errorf("fallback route %s: %w", p, err)
				}
			}
		}
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), 32)}
}

func linkUp(h *netlink.Handle, name string) error {
	lk, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	if err := h.LinkSetUp(lk); err != nil {
		return fmt.Errorf("link %s up: %w", name, err)
	}
	return nil
}

func addAddr(h *netlink.Handle, name string, p netip.Prefix) error {
	lk, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	if err := h.AddrAdd(lk, &netlink.Addr{IPNet: ipNet(p)}); err != nil {
		return fmt.Errorf("address %s on %s: %w", p, name, err)
	}
	return nil
}

// addTBF rate-limits a link's egress. The burst holds a few packets (or 1 ms
// of traffic at high rates) so TCP sees a smooth rate.
func addTBF(h *netlink.Handle, name string, rate uint64, mtu int) error {
	lk, err := h.LinkByName(name)
	if err != nil {
		return err
	}
	bps := rate / 8
	burst := uint32(bps / 1000)
	if min := uint32(4 * (mtu + 14)); burst < min {
		burst = min
	}
	q := &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: lk.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate:       bps,
		Buffer:     netlink.Xmittime(bps, burst),
		Limit:      uint32(bps/50) + burst, // ~20 ms of queue
	}
	if err := h.QdiscAdd(q); err != nil {
		return fmt.Errorf("tbf on %s: %w", name, err)
	}
	return nil
}

// startEmulator launches the emulator daemon (bin/mpi5k lab _emu) detached
// under setsid, and waits for its control socket.
func (l *Lab) startEmulator(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(l.dir, "emu.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(l.st.Binary, "lab", "_emu", "--name", l.name)
	cmd.Stdin = nil
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start emulator: %w", err)
	}
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := emuRequest(l.dir, emuReq{Op: "ping"}); err == nil {
			break
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(l.dir, "emu.log"))
			return fmt.Errorf("emulator exited (%v): %s", err, strings.TrimSpace(string(log)))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("emulator (pid %d) did not answer within 10s", pid)
		}
	}
	// The daemon outlives this process; the goroutine above reaps it if it
	// exits while we live.
	return nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Down removes everything a lab made: processes running in its namespaces
// (the emulator, iperf3, MPI daemons...), namespaces, UTS files and
// /run/mpi5k/<lab>, and takes out of net.ipv4.tcp_allowed_congestion_control
// what labs added that no lab still up needs. Idempotent and usable after a
// crash.
func Down(name string) error {
	_, err := DownNotes(name)
	return err
}

// DownNotes is Down, also telling what it changed outside the lab (the
// allowed congestion control list).
func DownNotes(name string) ([]string, error) {
	if name == "" {
		name = DefaultName
	}
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errNotRoot
	}
	dir := labDir(name)
	nsNames := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(dir, "lab.json")); err == nil {
		var st state
		if json.Unmarshal(b, &st) == nil {
			for _, n := range st.Namespaces {
				nsNames[n] = true
			}
		}
	}
	// Every file in the lab's netns directory is one of its namespaces (also
	// those of an up that crashed before saving its state).
	if ents, err := os.ReadDir(netnsDir(name)); err == nil {
		for _, e := range ents {
			nsNames[e.Name()] = true
		}
	}
	var errs []string
	// 1. Processes: the emulator by pid file, then anything inside the lab's
	// namespaces.
	killEmulator(dir)
	var inodes [][2]uint64
	for n := range nsNames {
		if dev, ino, ok := nsInode(filepath.Join(netnsDir(name), n)); ok {
			inodes = append(inodes, [2]uint64{dev, ino})
		}
	}
	if err := killInNamespaces(inodes); err != nil {
		errs = append(errs, err.Error())
	}
	// 2. Namespaces (their links, bridges, TUNs and qdiscs go with them).
	for n := range nsNames {
		if err := removeNSFile(filepath.Join(netnsDir(name), n)); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if ents, err := os.ReadDir(filepath.Join(dir, "uts")); err == nil {
		for _, e := range ents {
			if err := removeNSFile(filepath.Join(dir, "uts", e.Name())); err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	// 3. Files.
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err.Error())
	}
	// 4. The allowed congestion controls, once lab.json is gone.
	var notes []string
	if note, err := sysCC.settle(name); err != nil {
		errs = append(errs, err.Error())
	} else if note != "" {
		notes = append(notes, note)
	}
	if len(errs) > 0 {
		return notes, fmt.Errorf("lab %s down: %s", name, strings.Join(errs, "; "))
	}
	return notes, nil
}

func killEmulator(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "emu.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return
	}
	// Only kill it if the pid still is this lab's emulator (pids get reused).
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	lab := filepath.Base(dir)
	if !strings.Contains(string(cmdline), "\x00_emu\x00") || !strings.Contains(string(cmdline), "\x00"+lab) {
		return
	}
	killAndWait([]int{pid})
}

// killInNamespaces kills every process whose network namespace is one of
// the lab's (a few rounds: children may be forked while we kill).
func killInNamespaces(inodes [][2]uint64) error {
	for round := 0; round < 3; round++ {
		pids := pidsInNamespaces(inodes)
		if len(pids) == 0 {
			return nil
		}
		killAndWait(pids)
	}
	if pids := pidsInNamespaces(inodes); len(pids) > 0 {
		return fmt.Errorf("processes still running in the lab: %v", pids)
	}
	return nil
}

// pidsInNamespaces lists processes whose network namespace is in inodes.
func pidsInNamespaces(inodes [][2]uint64) []int {
	if len(inodes) == 0 {
		return nil
	}
	var pids []int
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		dev, ino, ok := nsInode(fmt.Sprintf("/proc/%d/ns/net", pid))
		if !ok {
			continue
		}
		for _, n := range inodes {
			if n[0] == dev && n[1] == ino && !isZombie(pid) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// killAndWait sends SIGTERM, then SIGKILL to what is left after 1 s.
func killAndWait(pids []int) {
	for _, p := range pids {
		_ = unix.Kill(p, unix.SIGTERM)
	}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		alive := false
		for _, p := range pids {
			if unix.Kill(p, 0) == nil && !isZombie(p) {
				alive = true
			}
		}
		if !alive {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, p := range pids {
		_ = unix.Kill(p, unix.SIGKILL)
	}
	time.Sleep(50 * time.Millisecond)
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z' || s[i+2] == 'X'
	}
	return false
}
