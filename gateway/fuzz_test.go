package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/sitemap"
)

// FuzzLANConn plays a node of the gateway's own site that sends arbitrary
// bytes on a LAN connection: a first frame, then (for a control
// connection) more frames. Whatever the bytes, the gateway must not
// panic, must answer only with well-formed replies, and the connection
// must end — refused, or at the end of the bytes, or by the first-frame
// deadline when the node goes quiet mid-frame — or be served and end when
// the node hangs up; then every slot and registration it held is
// released. quiet chooses a node that stays silent after its bytes rather
// than closing. The gateway runs without a WAN peer, so an OPEN that
// passes the checks is refused for want of a link.
func FuzzLANConn(f *testing.F) {
	node := netip.AddrPortFrom(netip.MustParseAddr("127.1.0.5"), 40000)
	dst := netip.AddrPortFrom(nodeB, 5000)
	frame := func(t header.Type, stream uint32, body []byte) []byte {
		return header.AppendFrame(nil, t, stream, body)
	}
	open := func(o header.Open) []byte {
		b, err := header.AppendOpen(nil, &o)
		if err != nil {
			f.Fatal(err)
		}
		return frame(header.TypeOpen, 0, b)
	}
	query := frame(header.TypePeerQuery, 7, header.AppendPeerQuery(nil, &header.PeerQuery{Seen: dst, Local: node}))
	listen := frame(header.TypeListen, 8, header.AppendListen(nil, 40123))
	for _, quiet := range []bool{false, true} {
		f.Add(open(header.Open{Dst: dst, Src: node, Label: "rank"}), quiet)
		f.Add(append(open(header.Open{Dst: dst, Src: node}), "application bytes"...), quiet)
		f.Add(open(header.Open{Dst: dst, Src: node, Resume: header.ResumeID{1}}), quiet)
		f.Add(open(header.Open{Dst: dst, Src: netip.AddrPortFrom(node.Addr(), 1)}), quiet)        // not its port
		f.Add(open(header.Open{Dst: netip.AddrPortFrom(node.Addr(), 9), Src: node}), quiet)       // own site
		f.Add(open(header.Open{Dst: netip.MustParseAddrPort("127.0.0.200:9"), Src: node}), quiet) // no site
		f.Add(query, quiet)
		f.Add(listen, quiet)
		f.Add(bytes.Join([][]byte{query, listen, frame(header.TypeListen, 9, header.AppendListen(nil, 80)), query}, nil), quiet)
		f.Add(append(listen, frame(header.TypeData, 1, []byte("x"))...), quiet) // not a control frame
		f.Add(append(query, listen[:5]...), quiet)                              // truncated second frame
		f.Add(query[:header.Size+3], quiet)                                     // truncated first body
		f.Add(query[:4], quiet)                                                 // truncated header
		f.Add(frame(header.TypeData, 1, []byte("data first")), quiet)
		f.Add(frame(header.TypeHello, 0, make([]byte, 18)), quiet)
		f.Add([]byte(nil), quiet)
	}
	// A DATA header announcing a whole MaxPayload body, never sent.
	f.Add([]byte{header.Version, byte(header.TypeData), 0, 0, 0, 0, 0, 1, 0, 0x10, 0, 0}, true)

	m := testMap(f)
	cfg, err := testConfig(m, "a")
	if err != nil {
		f.Fatal(err)
	}
	ln := &memListener{addr: siteA(m).Gateways[0].LAN, conns: make(chan LANConn), done: make(chan struct{})}
	cfg.Transport = ln
	cfg.FirstFrame, cfg.DrainTimeout, cfg.OpenTimeout = 20*time.Millisecond, 10*time.Millisecond, 10*time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	g, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { g.Run(ctx); close(stopped) }()
	f.Cleanup(func() { cancel(); <-stopped })

	f.Fuzz(func(t *testing.T, data []byte, quiet bool) {
		c := newMemConn(node, ln.addr, data, quiet)
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		select {
		case ln.conns <- c:
		case <-time.After(5 * time.Second):
			t.Fatal("gateway accepts no LAN connection")
		}
		select {
		case <-c.ended:
		case <-c.idle: // served, waiting for the node's next frame
			c.hangUp()
			select {
			case <-c.ended:
			case <-time.After(5 * time.Second):
				t.Fatal("a served connection does not end when the node hangs up")
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("connection neither ended nor was served (% x)", data)
		}
		// The connection's slots and registrations are released just
		// after it closes.
		for i := 0; g.lanConns.Load() != 0 || g.lanPending.Load() != 0 || g.listens.n.Load() != 0 || g.sources.count() != 0; i++ {
			if i == 5000 {
				t.Fatalf("after the connection: %d LAN conns, %d pending, %d listens, %d sources held",
					g.lanConns.Load(), g.lanPending.Load(), g.listens.n.Load(), g.sources.count())
			}
			time.Sleep(100 * time.Microsecond)
		}
		runtime.ReadMemStats(&ms)
		// Today a first frame may cost its announced length, up to
		// MaxPayload; nothing may cost more.
		if n := ms.TotalAlloc - before; n > header.MaxPayload+256<<10+uint64(4*len(data)) {
			t.Fatalf("%d bytes allocated for a connection of %d bytes", n, len(data))
		}
		r := header.NewReader(bytes.NewReader(c.written()), 0)
		for frames := 0; ; frames++ {
			h, _, err := r.ReadFrame(make([]byte, header.MaxControl))
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("gateway wrote a bad frame: %v", err)
			}
			switch h.Type {
			case header.TypePeerReply, header.TypeListenReply, header.TypeOpenReply:
			default:
				t.Fatalf("gateway answered a LAN connection with %v", h.Type)
			}
			if frames > len(data)/header.Size {
				t.Fatalf("%d replies to %d bytes", frames+1, len(data))
			}
		}
	})
}

func (t *sourceTable) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// memListener is a LANTransport whose connections the test hands it.
type memListener struct {
	addr  netip.AddrPort
	conns chan LANConn
	once  sync.Once
	done  chan struct{}
}

func (l *memListener) Listen(netip.AddrPort) (LANListener, error) { return l, nil }

func (l *memListener) Dial(context.Context, netip.Addr, netip.AddrPort, header.ResumeID, func(netip.AddrPort)) (LANConn, error) {
	return nil, errors.New("memListener dials nowhere")
}

func (l *memListener) Accept() (LANConn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Addr() netip.AddrPort { return l.addr }
func (l *memListener) Close() error         { l.once.Do(func() { close(l.done) }); return nil }

// memConn is a node's LAN connection in memory: reads return data, then
// end of file, or (quiet) block until the read deadline or the node hangs
// up. Writes are kept.
type memConn struct {
	local, remote netip.AddrPort
	quiet         bool

	mu       sync.Mutex
	data     []byte
	out      []byte
	deadline time.Time
	closed   bool

	ended, idle, gone           chan struct{}
	endOnce, idleOnce, goneOnce sync.Once
}

func newMemConn(remote, local netip.AddrPort, data []byte, quiet bool) *memConn {
	return &memConn{local: local, remote: remote, quiet: quiet, data: data,
		ended: make(chan struct{}), idle: make(chan struct{}), gone: make(chan struct{})}
}

var errDeadline = errors.New("i/o timeout")

func (c *memConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, net.ErrClosed
	}
	if len(c.data) > 0 {
		n := copy(b, c.data)
		c.data = c.data[n:]
		c.mu.Unlock()
		return n, nil
	}
	dl := c.deadline
	c.mu.Unlock()
	if !c.quiet {
		return 0, io.EOF
	}
	var expire <-chan time.Time
	if !dl.IsZero() {
		expire = time.After(time.Until(dl))
	} else {
		c.idleOnce.Do(func() { close(c.idle) })
	}
	select {
	case <-expire:
		return 0, errDeadline
	case <-c.gone:
		return 0, io.EOF
	case <-c.ended:
		return 0, net.ErrClosed
	}
}

func (c *memConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	c.out = append(c.out, b...)
	return len(b), nil
}

func (c *memConn) written() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out
}

func (c *memConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return nil
}

func (c *memConn) hangUp()           { c.goneOnce.Do(func() { close(c.gone) }) }
func (c *memConn) CloseWrite() error { return nil }
func (c *memConn) Abort() error      { return c.Close() }
func (c *memConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.endOnce.Do(func() { close(c.ended) })
	return nil
}
func (c *memConn) Local() netip.AddrPort  { return c.local }
func (c *memConn) Remote() netip.AddrPort { return c.remote }

func siteA(m interface {
	Site(string) (*sitemap.Site, bool)
}) *sitemap.Site {
	s, _ := m.Site("a")
	return s
}
