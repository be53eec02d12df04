package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// RunDir is the parent of every lab's state directory.
const RunDir = "/run/mpi5k"

// state is /run/mpi5k/<lab>/lab.json: everything needed to attach to, drive
// and tear down a lab, including after a crash of the process that built it.
type state struct {
	Config     Config
	Binary     string        // bin/mpi5k used for the daemon, exec and ssh
	Namespaces []string      // network namespace names, recorded before creation
	OneWay     time.Duration // emulated one-way delay after calibration
	PathCost   time.Duration // measured RTT of the path with zero emulated delay
	Ready      bool
}

// Lab is a running lab.
type Lab struct {
	name   string
	dir    string
	st     state
	hosts  []hostPlan
	byName map[string]*hostPlan
	notes  []string // what Up changed outside the lab
}

func labDir(name string) string { return filepath.Join(RunDir, name) }

func (l *Lab) statePath() string { return filepath.Join(l.dir, "lab.json") }

func (l *Lab) saveState() error {
	b, err := json.MarshalIndent(&l.st, "", "  ")
	if err != nil {
		return err
	}
	tmp := l.statePath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, l.statePath())
}

func newLab(st state) *Lab {
	l := &Lab{name: st.Config.Name, dir: labDir(st.Config.Name), st: st}
	l.hosts = planHosts(&l.st.Config)
	l.byName = map[string]*hostPlan{}
	for i := range l.hosts {
		l.byName[l.hosts[i].Name] = &l.hosts[i]
	}
	return l
}

// Open attaches to a running lab.
func Open(name string) (*Lab, error) {
	if name == "" {
		name = DefaultName
	}
	if err := ValidName(name); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(labDir(name), "lab.json"))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("lab %q is not up (no %s)", name, filepath.Join(labDir(name), "lab.json"))
		}
		return nil, err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("lab %q: corrupt state: %w", name, err)
	}
	if !st.Ready {
		return nil, fmt.Errorf("lab %q is not ready (still coming up, or a failed up: run `mpi5k lab down --name %s`)", name, name)
	}
	return newLab(st), nil
}

// Notes tells what Up changed outside the lab's namespaces (an algorithm
// added to net.ipv4.tcp_allowed_congestion_control, a module loaded, a
// crashed lab's addition undone), one line each.
func (l *Lab) Notes() []string { return l.notes }

// Name is the lab's name.
func (l *Lab) Name() string { return l.name }

// Config is the lab's normalized configuration.
func (l *Lab) Config() Config { return l.st.Config }

// Sites lists the site names in order (site id = index + 1).
func (l *Lab) Sites() []string { return append([]string(nil), l.st.Config.Sites...) }

// Hosts lists host names: the compute nodes of site (all sites if ""), plus
// the gateways when gateways is true.
func (l *Lab) Hosts(site string, gateways bool) []string {
	var out []string
	for _, h := range l.hosts {
		if site != "" && h.Site != site {
			continue
		}
		if h.Kind == kindNode || (gateways && h.Kind == kindGateway) {
			out = append(out, h.Name)
		}
	}
	return out
}

// Gateway is the (first) gateway host of site ("" if the site is unknown).
func (l *Lab) Gateway(site string) string {
	if gws := l.Gateways(site); len(gws) > 0 {
		return gws[0]
	}
	return ""
}

// Gateways lists the gateway hosts of site in order: gw.<site>, then
// gw2.<site>... (lab up --gateways); none if the site is unknown.
func (l *Lab) Gateways(site string) []string {
	var out []string
	for _, h := range l.hosts {
		if h.Kind == kindGateway && h.Site == site {
			out = append(out, h.Name)
		}
	}
	return out
}

// ExtraHosts lists the traffic hosts (x-1.<site>) used by Cross.
func (l *Lab) ExtraHosts(site string) []string {
	var out []string
	for _, h := range l.hosts {
		if h.Kind == kindExtra && (site == "" || h.Site == site) {
			out = append(out, h.Name)
		}
	}
	return out
}

// Addr is a host's LAN address (invalid if the host is unknown).
func (l *Lab) Addr(host string) netip.Addr {
	if h, ok := l.byName[host]; ok {
		return h.LAN
	}
	return netip.Addr{}
}

// WANAddr is a 2-NIC gateway's WAN leg address (invalid otherwise).
func (l *Lab) WANAddr(host string) netip.Addr {
	if h, ok := l.byName[host]; ok {
		return h.WAN
	}
	return netip.Addr{}
}

// SiteOf is the site of a host ("" if unknown).
func (l *Lab) SiteOf(host string) string {
	if h, ok := l.byName[host]; ok {
		return h.Site
	}
	return ""
}

// SiteMapPath is the site map file written at up.
func (l *Lab) SiteMapPath() string { return filepath.Join(l.dir, "sites.conf") }

// HostsFilePath is the lab's hosts file (bind-mounted over /etc/hosts in
// every command run in a lab host).
func (l *Lab) HostsFilePath() string { return filepath.Join(l.dir, "hosts") }

// ResolvConfPath is the lab's resolver configuration (bind-mounted over
// /etc/resolv.conf): no name server, so a name that is not a lab host fails
// at once instead of sending a query to the machine's DNS server, which lab
// hosts cannot and must not reach.
func (l *Lab) ResolvConfPath() string { return filepath.Join(l.dir, "resolv.conf") }

const resolvConf = "# mpi5k lab: names resolve through the lab's /etc/hosts only\noptions attempts:1 timeout:1\n"

// AgentDir holds the lab's `ssh` agent; Command puts it first on PATH.
func (l *Lab) AgentDir() string { return filepath.Join(l.dir, "bin") }

// GatewaysEnv is the MPI5K_GATEWAYS value for this lab.
func (l *Lab) GatewaysEnv() string {
	return gatewaysEnv(l.st.Config.Sites, l.st.Config.GatewaysPerSite())
}

// OneWayDelay is the delay the emulator applies per direction after
// subtracting the measured cost of the path itself.
func (l *Lab) OneWayDelay() time.Duration { return l.st.OneWay }

// PathCost is the round trip of the packet path with no emulated delay,
// measured at up.
func (l *Lab) PathCost() time.Duration { return l.st.PathCost }

// NetNSPath is the network namespace file of a host.
func (l *Lab) NetNSPath(host string) string {
	return filepath.Join(netnsDir(l.name), nsName(l.name, host))
}

func (l *Lab) utsPath(host string) string { return filepath.Join(l.dir, "uts", host) }

func (l *Lab) host(name string) (*hostPlan, error) {
	h, ok := l.byName[name]
	if !ok {
		return nil, fmt.Errorf("lab %s has no host %q (see `mpi5k lab hosts --name %s --gateways`)", l.name, name, l.name)
	}
	return h, nil
}

// Command returns a command that runs inside host: its network and UTS
// namespaces and the lab's /etc/hosts. The working directory and environment
// are kept; PATH starts with the lab's ssh agent directory and MPI5K_LAB /
// MPI5K_GATEWAYS are set.
func (l *Lab) Command(host string, name string, args ...string) *exec.Cmd {
	argv := append([]string{"lab", "_enter", "--name", l.name, host, "--", name}, args...)
	cmd := exec.Command(l.st.Binary, argv...)
	cmd.Env = l.Environ(os.Environ())
	return cmd
}

// CommandContext is Command with a context that kills the command.
func (l *Lab) CommandContext(ctx context.Context, host string, name string, args ...string) *exec.Cmd {
	argv := append([]string{"lab", "_enter", "--name", l.name, host, "--", name}, args...)
	cmd := exec.CommandContext(ctx, l.st.Binary, argv...)
	cmd.Env = l.Environ(os.Environ())
	return cmd
}

// Environ returns env with PATH prefixed by the agent directory and the lab
// variables set. It also sets OMPI_MCA_orte_keep_fqdn_hostnames=1 (unless
// set): Open MPI otherwise shortens node-1.site1 and node-1.site2 to the same
// "node-1" and maps both ranks on one host.
func (l *Lab) Environ(env []string) []string {
	out := make([]string, 0, len(env)+4)
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	fqdn := "OMPI_MCA_orte_keep_fqdn_hostnames=1"
	for _, e := range env {
		switch {
		case strings.HasPrefix(e, "OMPI_MCA_orte_keep_fqdn_hostnames="):
			fqdn = e
		case strings.HasPrefix(e, "PATH="):
			path = strings.TrimPrefix(e, "PATH=")
		case strings.HasPrefix(e, "MPI5K_LAB="), strings.HasPrefix(e, "MPI5K_GATEWAYS="):
		default:
			out = append(out, e)
		}
	}
	agent := l.AgentDir()
	if !strings.HasPrefix(path, agent+":") {
		path = agent + ":" + path
	}
	return append(out, "PATH="+path, "MPI5K_LAB="+l.name, "MPI5K_GATEWAYS="+l.GatewaysEnv(), fqdn)
}

// Do runs fn on a locked thread inside host's network namespace; sockets it
// opens stay in that namespace (for in-process test clients and servers).
func (l *Lab) Do(host string, fn func() error) error {
	if _, err := l.host(host); err != nil {
		return err
	}
	return inNetNS(l.NetNSPath(host), fn)
}

// Labs lists the names of labs with a state directory.
func Labs() []string {
	ents, _ := os.ReadDir(RunDir)
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

var errNotRoot = errors.New("the lab needs root (network namespaces, TUN devices, mounts)")
