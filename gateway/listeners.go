package gateway

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/mpi5k/mpi5k/header"
)

// The destination policy is bound to the jobs that run (docs/security.md):
// a stream from another site may reach a host:port of this site only while
// a rank listens there, or when the port is in --wan-allow-ports. The shim
// tells its site's gateway of each TCP listener a rank opens (LISTEN on a
// LAN control connection) and waits for the answer before listen()
// returns, so the port is known before the rank can publish it. The host
// is the control connection's source address, checked to be a node of the
// site as for every LAN connection (over MX, an address bound to the
// stream's MAC: lan_mx.go), so a node registers only its own ports; a
// registration lasts while its connection stays open, which is as long as
// the rank's process lives. Which process of the node holds the port the
// gateway cannot see, so it takes only ports in --lan-listen-ports, where
// ranks listen and users' services on fixed ports do not (the MX node
// daemon, which sees the node's sockets, checks the owner too).

// maxListensPerConn bounds the registrations of one control connection:
// a rank listens on a handful of ports (Open MPI: one per address family;
// UCX: one per device).
const maxListensPerConn = 256

// listenTable counts the registrations of each host:port.
type listenTable struct {
	mu sync.Mutex
	m  map[netip.AddrPort]int
	n  atomic.Int64 // distinct host:ports registered (a gauge)
}

func (t *listenTable) add(ap netip.AddrPort) {
	t.mu.Lock()
	if t.m[ap] == 0 {
		t.n.Add(1)
	}
	t.m[ap]++
	t.mu.Unlock()
}

func (t *listenTable) remove(ap netip.AddrPort) {
	t.mu.Lock()
	if t.m[ap]--; t.m[ap] <= 0 {
		delete(t.m, ap)
		t.n.Add(-1)
	}
	t.mu.Unlock()
}

func (t *listenTable) has(ap netip.AddrPort) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[ap] > 0
}

// admitsDst reports whether the destination policy lets a stream from
// another site reach dst, a host of this site.
func (g *Gateway) admitsDst(dst netip.AddrPort) bool {
	return g.cfg.AllowPorts.Has(dst.Port()) || g.listens.has(dst)
}

// listenPorts are the ports a LISTEN may register.
func (g *Gateway) listenPorts() PortSet {
	if g.cfg.ListenPorts == nil {
		return DefaultListenPorts
	}
	return g.cfg.ListenPorts
}

// serveControl serves a node's control connection: PEER_QUERY and LISTEN
// frames, each answered under its request id, until the node closes it;
// then the connection's registrations end.
func (g *Gateway) serveControl(c LANConn, h header.Header, body []byte) {
	host := c.Remote().Addr()
	var mine []netip.AddrPort
	defer func() {
		for _, ap := range mine {
			g.listens.remove(ap)
		}
		c.Close()
	}()
	idle := g.watchIdle(c)
	defer idle.stop()
	r := header.NewReader(c, 4096)
	var buf [64]byte
	out := make([]byte, 0, header.Size+32)
	for {
		switch h.Type {
		case header.TypePeerQuery:
			q, err := header.ParsePeerQuery(body)
			if err != nil {
				g.refuseLAN(c, "lan_query", "bad PEER_QUERY", "err", err)
				return
			}
			rec, found := g.records.get(recordKey{unmapAP(q.Seen), unmapAP(q.Local)})
			rep := header.PeerReply{Found: found, SiteID: rec.site, Source: rec.src}
			out = header.AppendPeerReply(out[:header.Size], &rep)
			header.Header{Type: header.TypePeerReply, Stream: h.Stream, Length: uint32(len(out) - header.Size)}.Encode(out)
			g.m.peerQueries.WithLabelValues(fmt.Sprint(found)).Inc()
		case header.TypeListen:
			port, err := header.ParseListen(body)
			if err != nil {
				g.refuseLAN(c, "lan_query", "bad LISTEN", "err", err)
				return
			}
			code := header.ListenOK
			switch ap := netip.AddrPortFrom(host, port); {
			case port < 1024:
				code = header.ListenPrivileged
				g.refused("listen_privileged", "LISTEN refused: a rank never listens on a privileged port", "host", host.String(), "port", port)
			case !g.listenPorts().Has(port):
				code = header.ListenPort
				g.refused("listen_port", "LISTEN refused: the port is outside --lan-listen-ports, where ranks listen (a service of the node, or a rank whose MPI binds elsewhere: docs/security.md)",
					"host", host.String(), "port", port, "allowed", g.listenPorts().String())
			case len(mine) >= maxListensPerConn:
				code = header.ListenLimit
				g.refused("listen_limit", "LISTEN refused: the control connection registered too many ports", "host", host.String(), "limit", maxListensPerConn)
			default:
				g.listens.add(ap)
				mine = append(mine, ap)
				g.log.Debug("rank listens", "host", host.String(), "port", port)
			}
			out = append(out[:header.Size], code)
			header.Header{Type: header.TypeListenReply, Stream: h.Stream, Length: 1}.Encode(out)
		default:
			g.refuseLAN(c, "lan_query", "control connection carries only PEER_QUERY and LISTEN", "type", h.Type.String())
			return
		}
		if _, err := c.Write(out); err != nil {
			return
		}
		var err error
		idle.wait(len(mine) > 0)
		h, body, err = r.ReadFrame(buf[:])
		if err != nil {
			if !errors.Is(err, io.EOF) && !idle.fired() {
				g.refuseLAN(c, "lan_query", "control connection", "err", err)
			}
			return
		}
	}
}
