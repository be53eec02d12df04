package main

/*
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/sitemap"
)

// config is the shim's view of the environment, loaded once per process
// (docs/shim.md lists the variables).
type config struct {
	m        *sitemap.Map
	mapPath  string
	local    *sitemap.Site
	timeout  time.Duration // bound on the gateway connect + OPEN
	fallback bool          // MPI5K_FALLBACK=direct
	label    string        // OPEN label: "rank R pid P"
	// node is the node daemon of --lan-transport mx (MPI5K_NODE): when
	// set, relayed connections and the control connection go to it, on
	// loopback, instead of to the site gateway.
	node netip.AddrPort
	// gws are where the process's relayed and control connections go:
	// the node daemon, or the site's gateway hosts (the map's site record,
	// then its gateway records; at most sitemap.MaxGateways).
	gws []netip.AddrPort
}

var (
	cfgOnce  sync.Once
	cfgVal   *config
	cfgErr   error
	cfgWarne sync.Once
)

// getConfig returns nil when the process only passes through (C decided so,
// or the map cannot be used); the reason is logged once, when a connect or
// accept needed the map (not for processes that never did, like a shell
// that runs before the host's name and addresses are set up).
func getConfig() *config {
	c := loadOnce()
	if cfgErr != nil {
		cfgWarne.Do(func() { logf(levelError, "passing everything through: %v", cfgErr) })
	}
	return c
}

func loadOnce() *config {
	cfgOnce.Do(func() {
		if C.mpi5k_enabled() == 0 {
			return
		}
		c, err := loadConfig()
		if err != nil {
			cfgErr = err
			return
		}
		cfgVal = c
		// Connections accepted from the node daemon are relayed ones,
		// as those from the gateway are without it.
		setGateways(c.gws)
		logf(levelDebug, "site %s (id %d), gateways %v, map %s, GODEBUG=%s", c.local.Name, c.local.ID, c.gws, c.mapPath, os.Getenv("GODEBUG"))
	})
	return cfgVal
}

func loadConfig() (*config, error) {
	c := &config{mapPath: os.Getenv("MPI5K_MAP"), timeout: 2 * time.Second}
	text, err := readFileRaw(c.mapPath)
	if err != nil {
		return nil, fmt.Errorf("site map: %w", err)
	}
	m, err := sitemap.Parse(bytes.NewReader(text), c.mapPath)
	if err != nil {
		return nil, err
	}
	c.m = m
	if name := os.Getenv("MPI5K_SITE"); name != "" {
		s, ok := m.Site(name)
		if !ok {
			return nil, fmt.Errorf("MPI5K_SITE=%s is not a site of %s", name, c.mapPath)
		}
		c.local = s
	} else {
		s, err := siteFromInterfaces(m)
		if err != nil {
			return nil, fmt.Errorf("%v (map %s); set MPI5K_SITE", err, c.mapPath)
		}
		c.local = s
	}
	if v := os.Getenv("MPI5K_CONNECT_TIMEOUT"); v != "" {
		d, err := parseDuration(v)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("MPI5K_CONNECT_TIMEOUT=%q: want a duration like 2s or seconds", v)
		}
		c.timeout = d
	}
	if v := os.Getenv("MPI5K_NODE"); v != "" {
		ap, err := netip.ParseAddrPort(v)
		if err != nil || !ap.Addr().IsLoopback() || ap.Port() == 0 {
			return nil, fmt.Errorf("MPI5K_NODE=%q: want the node daemon's loopback address and port, e.g. 127.0.0.1:5070", v)
		}
		c.node = ap
		c.gws = []netip.AddrPort{ap}
	} else {
		for _, g := range c.local.Gateways {
			c.gws = append(c.gws, g.LAN)
		}
	}
	switch v := os.Getenv("MPI5K_FALLBACK"); v {
	case "", "none":
	case "direct":
		c.fallback = true
	default:
		return nil, fmt.Errorf("MPI5K_FALLBACK=%q: want direct or none", v)
	}
	rank := os.Getenv("OMPI_COMM_WORLD_RANK")
	if rank == "" {
		rank = os.Getenv("PMI_RANK")
	}
	if rank != "" {
		c.label = fmt.Sprintf("rank %s pid %d", rank, os.Getpid())
	} else {
		c.label = fmt.Sprintf("pid %d", os.Getpid())
	}
	return c, nil
}

// readFileRaw reads a file with plain syscalls. os.Open would start the Go
// runtime's netpoller (an epoll fd and an eventfd) inside the host process,
// shifting its fd numbers; the shim never needs it.
func readFileRaw(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var out []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return out, nil
		}
		if len(out)+n > 16<<20 {
			return nil, fmt.Errorf("%s: larger than 16 MiB, not a site map", path)
		}
		out = append(out, buf[:n]...)
	}
}

func parseDuration(v string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		return time.Duration(f * float64(time.Second)), nil
	}
	return time.ParseDuration(v)
}

// siteFromInterfaces finds the site of this host from its own addresses.
func siteFromInterfaces(m *sitemap.Map) (*sitemap.Site, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing this host's addresses: %v", err)
	}
	var found *sitemap.Site
	for _, a := range addrs {
		pn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(pn.IP)
		if !ok || ip.IsLoopback() {
			continue
		}
		s, ok := m.Lookup(ip.Unmap())
		if !ok {
			continue
		}
		if found != nil && found != s {
			return nil, fmt.Errorf("this host has addresses in sites %s and %s", found.Name, s.Name)
		}
		found = s
	}
	if found == nil {
		return nil, fmt.Errorf("none of this host's addresses is in the site map")
	}
	return found, nil
}

type level int

const (
	levelError level = iota
	levelWarn
	levelInfo
	levelDebug
)

var logLevel = func() level {
	switch strings.ToLower(os.Getenv("MPI5K_LOG")) {
	case "error":
		return levelError
	case "info":
		return levelInfo
	case "debug":
		return levelDebug
	}
	return levelWarn
}()

// logf writes one line to stderr: the host program owns stdout.
func logf(l level, format string, args ...any) {
	if l > logLevel {
		return
	}
	fmt.Fprintf(os.Stderr, "mpi5k[%d]: %s\n", os.Getpid(), fmt.Sprintf(format, args...))
}
