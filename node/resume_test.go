package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/mpi5k/mpi5k/gateway"
	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/mx"
	"github.com/mpi5k/mpi5k/sitemap"
)

// grid is two sites of two gateways each, every gateway and one node
// daemon per site on the site's in-memory Ethernet, the WAN on loopback.
type grid struct {
	m      *sitemap.Map
	nodes  [2]*Daemon
	addrs  [2]netip.Addr // the nodes' LAN addresses
	links  [2][]*mx.MemLink
	stops  [2][]context.CancelFunc
	cfgLog *slog.Logger
}

func freePort(t testing.TB, a netip.Addr) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", netip.AddrPortFrom(a, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return addrPort(l.Addr()).Port()
}

// Short MX timeouts: a dead gateway is noticed within about a second.
var gridMX = mx.Config{PeerTimeout: time.Second, KeepAlive: 200 * time.Millisecond}

func startGrid(t testing.TB, nodeCfg func(*Config)) *grid {
	// The gateways' warnings of links broken at their stop would bury a
	// benchmark's lines; MPI5K_TEST_LOG shows everything.
	lvl := slog.LevelError
	if os.Getenv("MPI5K_TEST_LOG") != "" {
		lvl = slog.LevelDebug
	}
	g := &grid{cfgLog: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))}
	b := sitemap.NewBuilder()
	names := []string{"a", "b"}
	for s, name := range names {
		for i := range 2 {
			a := netip.AddrFrom4([4]byte{127, byte(s + 1), 0, byte(1 + i)})
			lan, wan := netip.AddrPortFrom(a, freePort(t, a)), netip.AddrPortFrom(a, freePort(t, a))
			if i == 0 {
				b.AddSite(name, uint8(s+1), lan, wan)
			} else {
				b.AddGateway(name, lan, wan)
			}
		}
		b.AddNet(name, netip.PrefixFrom(netip.AddrFrom4([4]byte{127, byte(s + 1), 0, 0}), 16))
		g.addrs[s] = netip.AddrFrom4([4]byte{127, byte(s + 1), 0, 50})
	}
	m, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	g.m = m
	var gws []*gateway.Gateway
	for s, name := range names {
		hub := mx.NewMemHub(1500)
		attach := func(mac mx.MAC) *mx.Endpoint {
			l := hub.Attach(mac)
			g.links[s] = append(g.links[s], l)
			return endpoint(t, l, gridMX)
		}
		nodeEP := attach(mx.MAC{2, 0, 0, 0, byte(s + 1), 2})
		site, _ := m.Site(name)
		var dgws []Gateway
		for i, gw := range site.Gateways {
			tr := &gateway.MXTransport{EP: attach(mx.MAC{2, 0, 0, 0, byte(s + 1), byte(10 + i)}),
				Resolve: func(netip.Addr) (mx.Addr, error) { return nodeEP.Addr(), nil }}
			fs := pflag.NewFlagSet("gateway", pflag.ContinueOnError)
			f := gateway.NewFlags(fs, false)
			if err := fs.Parse([]string{"--wan-trunk=shared", "--wan-keep-warm=false", "--wan-queue=0", "--wan-rto-min=0", "--wan-delack-max=0", "--wan-allow-ports=any"}); err != nil {
				t.Fatal(err)
			}
			cfg, err := f.Config()
			if err != nil {
				t.Fatal(err)
			}
			cfg.Map, cfg.Site, cfg.ListenLAN, cfg.ListenWAN, cfg.Transport = m, name, gw.LAN, gw.WAN, tr
			cfg.DrainTimeout, cfg.PingInterval, cfg.FirstFrame = time.Second, time.Second, time.Minute
			cfg.Logger = g.cfgLog.With("gateway", fmt.Sprintf("%s%d", name, i))
			gwy, err := gateway.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { gwy.Run(ctx); close(done) }()
			t.Cleanup(func() { cancel(); <-done })
			g.stops[s] = append(g.stops[s], cancel)
			gws = append(gws, gwy)
			dgws = append(dgws, Gateway{LAN: gw.LAN, MX: tr.EP.Addr()})
		}
		cfg := Config{Addr: g.addrs[s], Listen: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + s)}), 0),
			Gateways: dgws, EP: nodeEP, DialTimeout: 2 * time.Second, Log: g.cfgLog.With("node", name)}
		if nodeCfg != nil {
			nodeCfg(&cfg)
		}
		d := startDaemon(t, cfg)
		g.nodes[s] = d
	}
	for i, gwy := range gws {
		select {
		case <-gwy.Ready():
		case <-time.After(10 * time.Second):
			t.Fatalf("gateway %d: mesh did not come up", i)
		}
	}
	return g
}

// kill takes gateway i of site s off its LAN at once (its MX frames are
// lost, as a dead host's) and stops it, which ends its WAN links.
func (g *grid) kill(s, i int) {
	g.links[s][1+i].Close()
	g.stops[s][i]()
}

// pacedEcho sends random bytes through the node daemon d to dst, 16 KiB
// every gap until stop is closed (at least min bytes), reads the echo and
// compares digests. started, if not nil, hears when the first bytes are
// back.
func pacedEcho(d *Daemon, dst netip.AddrPort, seed uint64, min int, gap time.Duration, stop <-chan struct{}, started chan<- bool) error {
	c, err := net.Dial("tcp", d.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	body, _ := header.AppendOpen(nil, &header.Open{Dst: dst, Src: addrPort(c.LocalAddr())})
	if _, err := c.Write(header.AppendFrame(nil, header.TypeOpen, 0, body)); err != nil {
		return err
	}
	c.SetDeadline(time.Now().Add(120 * time.Second))
	sent, got := sha256.New(), sha256.New()
	werr := make(chan error, 1)
	size := 0
	go func() {
		r := rand.New(rand.NewPCG(seed, 7))
		buf := make([]byte, 16<<10)
		for {
			select {
			case <-stop:
				if size >= min {
					werr <- c.(*net.TCPConn).CloseWrite()
					return
				}
			default:
			}
			for i := range buf {
				buf[i] = byte(r.Uint32())
			}
			sent.Write(buf)
			size += len(buf)
			if _, err := c.Write(buf); err != nil {
				werr <- err
				return
			}
			time.Sleep(gap)
		}
	}()
	var first [1]byte
	n, err := io.ReadFull(c, first[:])
	if started != nil {
		started <- err == nil
	}
	if err == nil {
		got.Write(first[:])
		var m int64
		m, err = io.Copy(got, c)
		n += int(m)
	}
	if err2 := <-werr; err == nil {
		err = err2
	}
	if err != nil {
		return fmt.Errorf("after %d of %d bytes back: %w", n, size, err)
	}
	if n != size || !bytes.Equal(sent.Sum(nil), got.Sum(nil)) {
		return fmt.Errorf("%d bytes back of %d, digests differ: %v", n, size, !bytes.Equal(sent.Sum(nil), got.Sum(nil)))
	}
	return nil
}

// TestResumeAcrossGatewayLoss: connections between node daemons of two
// sites survive the loss of a gateway host mid-transfer, on either side,
// with every byte delivered once and in order: each connection echoes
// what it sends, checked by digest, until one gateway of site a and then
// one of site b has died and its streams have moved.
func TestResumeAcrossGatewayLoss(t *testing.T) {
	g := startGrid(t, func(c *Config) { c.Hold = 20 * time.Second })
	dst := testnet.Echo(t, g.addrs[1])
	const conns = 4
	var wg sync.WaitGroup
	errs := make([]error, conns)
	stop := make(chan struct{})
	started := make(chan bool, conns)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = pacedEcho(g.nodes[0], dst, uint64(i), 1<<20, 10*time.Millisecond, stop, started)
		}()
	}
	// Every connection is through, both daemons' HELLOs exchanged.
	for range conns {
		if !<-started {
			close(stop)
			wg.Wait()
			t.Fatalf("a connection did not start: %v", errs)
		}
	}
	waitResumes := func(n int64, what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); g.nodes[0].Resumes() < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d connections resumed at site a, want %d", what, g.nodes[0].Resumes(), n)
			}
		}
	}
	time.Sleep(300 * time.Millisecond)
	// With four connections spread round robin over two gateways, each
	// gateway carries two.
	g.kill(0, 0)
	waitResumes(2, "after gateway a0 died")
	before := g.nodes[0].Resumes()
	g.kill(1, 1)
	waitResumes(before+1, "after gateway b1 died")
	close(stop)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("connection %d: %v", i, err)
		}
	}
	// Site b took every resume site a completed, and maybe some that
	// broke before its answer arrived.
	if a, b := g.nodes[0].Resumes(), g.nodes[1].Resumes(); b < a {
		t.Errorf("site a resumed %d connections, site b took %d resumes", a, b)
	}
	// New connections go through the gateways left.
	if err := pacedEcho(g.nodes[0], dst, 99, 1<<20, 0, stop, nil); err != nil {
		t.Errorf("connection after the losses: %v", err)
	}
}

// BenchmarkResume: what the resumable framing costs, against plain
// streams on the same in-process grid (node daemon, MX on an in-memory
// LAN, gateway, loopback WAN, gateway, MX, node daemon, echoing rank):
// rtt1B, one-byte round trips; bulk, 64 KiB writes echoed back. It
// reports the process's CPU per operation beside the time.
func BenchmarkResume(b *testing.B) {
	for _, mode := range []string{"plain", "resume"} {
		for _, work := range []string{"rtt1B", "bulk"} {
			b.Run(mode+"/"+work, func(b *testing.B) {
				g := startGrid(b, func(c *Config) { c.NoResume = mode == "plain" })
				dst := testnet.Echo(b, g.addrs[1])
				c, err := net.Dial("tcp", g.nodes[0].Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				body, _ := header.AppendOpen(nil, &header.Open{Dst: dst, Src: addrPort(c.LocalAddr())})
				c.Write(header.AppendFrame(nil, header.TypeOpen, 0, body))
				size := 1
				if work == "bulk" {
					size = 64 << 10
				}
				buf := make([]byte, size)
				back := make([]byte, size)
				for range 10 { // warm up: connect, first exchanges
					c.Write(buf)
					io.ReadFull(c, back)
				}
				cpu0 := cpuTime()
				b.ResetTimer()
				for range b.N {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c, back); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/1e3, "cpu-µs/op")
				if work == "bulk" {
					b.SetBytes(int64(2 * size))
				}
			})
		}
	}
}

// cpuTime is the process's user and system CPU so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
