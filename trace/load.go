package trace

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/mpi5k/mpi5k/sitemap"
)

// UnknownSite names the site of an address no header, gateway answer or
// site map placed.
const UnknownSite = "?"

// Proc is one traced process (one trace file).
type Proc struct {
	File    string `json:"file"`
	Host    string `json:"host"`
	PID     uint32 `json:"pid"`
	Site    string `json:"site"`
	Rank    int32  `json:"rank"` // MPI rank, -1 unknown
	Records int    `json:"records"`
	Lost    uint64 `json:"lost_records"` // dropped by the shim's ring (KindLost)
	// Truncated: the file ended inside a record (the process died).
	Truncated bool `json:"truncated,omitempty"`
	hdr       Header
}

// Write is one successful data write on a connection.
type Write struct {
	T    int64 // wall clock, Unix ns
	Size int64 // bytes the kernel took
}

// Sample is one TCP_INFO sample of a connection.
type Sample struct {
	T int64 // wall clock, Unix ns
	TCPSample
}

// Conn is one TCP connection as one traced process saw it (a connection
// between two traced processes appears once in each file: each side's
// writes are its own).
type Conn struct {
	ID       string         `json:"id"` // host.pid.fd, "-N" appended when the fd was reused
	Host     string         `json:"host"`
	PID      uint32         `json:"pid"`
	FD       int32          `json:"fd"`
	Site     string         `json:"site"`
	Local    netip.AddrPort `json:"local"`
	Peer     netip.AddrPort `json:"peer"` // the true peer (not the gateway)
	PeerHost string         `json:"peer_host"`
	PeerSite string         `json:"peer_site"`
	Relayed  bool           `json:"relayed"` // through a gateway (connected or accepted)
	Accepted bool           `json:"accepted"`
	Start    int64          `json:"start_ns"`
	End      int64          `json:"end_ns"` // 0: not closed in the trace
	Read     int64          `json:"bytes_read"`
	Writes   []Write        `json:"-"`
	Samples  []Sample       `json:"-"`
}

// Scope says where a connection's peer is.
type Scope string

// Scopes.
const (
	ScopeWAN     Scope = "wan"     // the peer is in another site
	ScopeLAN     Scope = "lan"     // same site, another host
	ScopeLocal   Scope = "local"   // same host (loopback or own address)
	ScopeUnknown Scope = "unknown" // the peer or its site is not known
)

// Scope classifies c.
func (c *Conn) Scope() Scope {
	switch {
	case c.PeerHost == c.Host || c.Peer.Addr().IsLoopback():
		return ScopeLocal
	case !c.Peer.IsValid() || c.Site == UnknownSite || c.PeerSite == UnknownSite:
		return ScopeUnknown
	case c.Site != c.PeerSite:
		return ScopeWAN
	}
	return ScopeLAN
}

// Last returns the connection's last sample (its cumulative counters).
func (c *Conn) Last() (Sample, bool) {
	if len(c.Samples) == 0 {
		return Sample{}, false
	}
	return c.Samples[len(c.Samples)-1], true
}

// Trace is a directory of trace files, decoded and resolved.
type Trace struct {
	Dir   string
	Procs []*Proc
	Conns []*Conn
}

// isWrite / isRead: data calls by direction.
func isWrite(f Func) bool {
	return f == FnWrite || f == FnWritev || f == FnSend || f == FnSendto || f == FnSendmsg
}

func isRead(f Func) bool {
	return f == FnRead || f == FnReadv || f == FnRecv || f == FnRecvfrom || f == FnRecvmsg
}

// Load reads every *.trace file of dir. m (may be nil) places addresses
// whose site the traces do not say.
func Load(dir string, m *sitemap.Map) (*Trace, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.trace"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("trace directory: %w", err)
		}
		return nil, fmt.Errorf("no *.trace files in %s (was MPI5K_TRACE set for the run?)", dir)
	}
	sort.Strings(files)
	t := &Trace{Dir: dir}
	for _, f := range files {
		p, conns, err := loadFile(f)
		if err != nil {
			return nil, err
		}
		t.Procs = append(t.Procs, p)
		t.Conns = append(t.Conns, conns...)
	}
	t.resolve(m)
	return t, nil
}

func loadFile(path string) (*Proc, []*Conn, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	r, err := NewReader(f)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	p := &Proc{File: filepath.Base(path), Host: r.Header.Host, PID: r.Header.PID, Site: r.Header.Site, Rank: r.Header.Rank, hdr: r.Header}
	if p.Host == "" {
		p.Host = fmt.Sprintf("pid%d", p.PID)
	}
	var recs []Record
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			p.Truncated = true
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: record %d: %w", path, len(recs)+1, err)
		}
		recs = append(recs, rec)
	}
	p.Records = len(recs)
	// The flusher drains threads' records roughly in time order only.
	slices.SortStableFunc(recs, func(a, b Record) int {
		switch {
		case a.Mono < b.Mono:
			return -1
		case a.Mono > b.Mono:
			return 1
		}
		return 0
	})
	return p, buildConns(p, recs), nil
}

// buildConns splits a process's records into connections: a KindConn
// record starts one on its fd, close ends it, data calls and samples on an
// fd with no known connection start an anonymous one (opened before
// tracing, or a dup).
func buildConns(p *Proc, recs []Record) []*Conn {
	var all []*Conn
	open := map[int32]*Conn{}
	uses := map[int32]int{}
	h := &p.hdr
	newConn := func(fd int32, t int64) *Conn {
		uses[fd]++
		id := fmt.Sprintf("%s.%d.%d", p.Host, p.PID, fd)
		if n := uses[fd]; n > 1 {
			id = fmt.Sprintf("%s-%d", id, n)
		}
		c := &Conn{ID: id, Host: p.Host, PID: p.PID, FD: fd, Start: t}
		all = append(all, c)
		open[fd] = c
		return c
	}
	for i := range recs {
		rec := &recs[i]
		t := h.WallTime(rec.Mono).UnixNano()
		switch rec.Kind {
		case KindLost:
			p.Lost += uint64(rec.Ret)
		case KindConn:
			c := open[rec.FD]
			if c == nil || c.Local.IsValid() || c.Peer.IsValid() || len(c.Writes) > 0 || c.Read > 0 {
				c = newConn(rec.FD, t)
			}
			c.Local, c.Peer = rec.Local, rec.Peer
			c.Relayed = rec.Flags&(FlagRelayed|FlagTruePeer) != 0
			c.Accepted = rec.Fn == FnAccept || rec.Fn == FnAccept4
			if rec.Site != 0 {
				c.PeerSite = fmt.Sprintf("#%d", rec.Site) // resolved to a name later
			}
		case KindSample:
			c := open[rec.FD]
			if c == nil {
				c = newConn(rec.FD, t)
			}
			c.Samples = append(c.Samples, Sample{T: t, TCPSample: rec.TCP})
		case KindCall:
			switch {
			case rec.Fn == FnClose:
				if c := open[rec.FD]; c != nil {
					c.End = t
					delete(open, rec.FD)
				}
			case isWrite(rec.Fn) && rec.Ret > 0:
				c := open[rec.FD]
				if c == nil {
					c = newConn(rec.FD, t)
				}
				c.Writes = append(c.Writes, Write{T: t, Size: rec.Ret})
			case isRead(rec.Fn) && rec.Ret > 0:
				c := open[rec.FD]
				if c == nil {
					c = newConn(rec.FD, t)
				}
				c.Read += rec.Ret
			}
		}
	}
	return all
}

// resolve names the sites of processes and the hosts and sites of peers:
// site ids the gateway reported, trace headers, addresses other traced
// processes used locally, and the site map, in that order of trust.
func (t *Trace) resolve(m *sitemap.Map) {
	siteByID := map[uint8]string{}
	for _, p := range t.Procs {
		if p.hdr.SiteID != 0 && p.Site != "" {
			siteByID[p.hdr.SiteID] = p.Site
		}
	}
	if m != nil {
		for _, s := range m.Sites() {
			if _, ok := siteByID[s.ID]; !ok {
				siteByID[s.ID] = s.Name
			}
		}
	}
	lookup := func(a netip.Addr) string {
		if m != nil && a.IsValid() {
			if s, ok := m.Lookup(a.Unmap()); ok {
				return s.Name
			}
		}
		return ""
	}
	// Host of an address: the processes that used it as a local address.
	addrHost := map[netip.Addr]string{}
	hostSite := map[string]string{}
	for _, p := range t.Procs {
		if p.Site != "" {
			hostSite[p.Host] = p.Site
		}
	}
	for _, c := range t.Conns {
		if a := c.Local.Addr().Unmap(); a.IsValid() && !a.IsLoopback() && !a.IsUnspecified() {
			addrHost[a] = c.Host
			if hostSite[c.Host] == "" {
				hostSite[c.Host] = lookup(a)
			}
		}
	}
	if m != nil {
		for _, s := range m.Sites() {
			for _, h := range s.Hosts {
				for _, a := range h.Addrs {
					if _, ok := addrHost[a]; !ok {
						addrHost[a] = h.Name
					}
				}
			}
		}
	}
	for _, p := range t.Procs {
		if p.Site == "" {
			p.Site = hostSite[p.Host]
		}
		if p.Site == "" {
			p.Site = UnknownSite
		}
	}
	procSite := map[string]string{}
	for _, p := range t.Procs {
		procSite[fmt.Sprintf("%s.%d", p.Host, p.PID)] = p.Site
	}
	for _, c := range t.Conns {
		c.Site = procSite[fmt.Sprintf("%s.%d", c.Host, c.PID)]
		pa := c.Peer.Addr().Unmap()
		switch {
		case !pa.IsValid():
			c.PeerHost = ""
		case pa.IsLoopback():
			c.PeerHost = c.Host
		default:
			if h, ok := addrHost[pa]; ok {
				c.PeerHost = h
			} else {
				c.PeerHost = pa.String()
			}
		}
		if id, ok := strings.CutPrefix(c.PeerSite, "#"); ok {
			var n int
			fmt.Sscan(id, &n)
			c.PeerSite = siteByID[uint8(n)]
		}
		if c.PeerSite == "" && c.PeerHost == c.Host {
			c.PeerSite = c.Site
		}
		if c.PeerSite == "" {
			c.PeerSite = lookup(pa)
		}
		if c.PeerSite == "" {
			c.PeerSite = hostSite[c.PeerHost]
		}
		if c.PeerSite == "" {
			c.PeerSite = UnknownSite
		}
	}
}
