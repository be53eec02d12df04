package gateway

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/gateway/mxlan"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/mx"
)

// BenchmarkScaleHub with MPI5K_SCALE_LAN=mx: every LAN is MX carried as
// UDP datagrams on loopback (testnet.UDPLink), so the processes share one
// Ethernet and a stream holds no file descriptor anywhere. The hub child's
// LAN transport is MX with the production engine settings (mxlan.PeerTimeout,
// mxlan.KeepAlive; no Allow: loopback has no neighbour table) and the
// production stream settings; the clients (one MX endpoint in a child
// process, playing the node daemons) open every stream as a node daemon
// does (mxOpen); the peers deliver to one destination MX endpoint in
// another child process, which accepts every stream and keeps it idle.
//
// The load side (clients, peers, destination) carries no byte after OPEN,
// so its streams and the peers' relay chunk are 1 KiB and the peers'
// engines keep small frame pools: with the production sizes the 100 000
// streams would cost the test process and the children gigabytes that the
// hub, which is measured, shares the machine with.

// scaleMXStream sizes the load side's MX streams (see above).
var scaleMXStream = mx.StreamConfig{Chunk: 1 << 10, Window: 1 << 10}

// freeUDPPort returns a UDP port of 127.0.0.1 free a moment ago.
func freeUDPPort(b testing.TB) int {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// udpMXEndpoint starts an MX engine on a UDP link on port (0: any) and
// opens the gateways' endpoint number on it.
func udpMXEndpoint(port int, cfg mx.Config) (*mx.Engine, *mx.Endpoint, error) {
	link, err := testnet.OpenUDPLink(port)
	if err != nil {
		return nil, nil, err
	}
	e, err := mx.New(link, cfg)
	if err != nil {
		link.Close()
		return nil, nil, err
	}
	ep, err := e.Open(mxlan.Endpoint)
	if err != nil {
		e.Close()
		return nil, nil, err
	}
	return e, ep, nil
}

// scaleHubMX is the hub child's LAN transport with MPI5K_GW_LAN_MX set:
// spec "udpport,maxlanconns". MaxLANConns is raised because its default
// follows the open-file limit, which MX streams do not use.
func scaleHubMX(cfg *Config, spec string) error {
	f := strings.Split(spec, ",")
	port, _ := strconv.Atoi(f[0])
	_, ep, err := udpMXEndpoint(port, mx.Config{PeerTimeout: mxlan.PeerTimeout, KeepAlive: mxlan.KeepAlive})
	if err != nil {
		return err
	}
	cfg.Transport = &MXTransport{EP: ep}
	if len(f) > 1 {
		cfg.MaxLANConns, _ = strconv.Atoi(f[1])
	}
	return nil
}

// scalePeerMX is a peer gateway's LAN transport: every destination is the
// MX endpoint dst. The engine lives until the benchmark ends.
func scalePeerMX(b *testing.B, dst mx.Addr) *MXTransport {
	e, ep, err := udpMXEndpoint(0, mx.Config{PeerTimeout: mxlan.PeerTimeout, KeepAlive: mxlan.KeepAlive, Window: 64, Buffers: 128})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return &MXTransport{EP: ep, Stream: scaleMXStream,
		Resolve: func(netip.Addr) (mx.Addr, error) { return dst, nil }}
}

// scaleDstMXChild is the destination of every stream: an MX endpoint on
// UDP port udpport that accepts streams, holds them open and idle, and
// keeps their count in countfile. spec: "udpport,countfile".
func scaleDstMXChild(spec string) int {
	f := strings.Split(spec, ",")
	port, _ := strconv.Atoi(f[0])
	_, ep, err := udpMXEndpoint(port, mx.Config{PeerTimeout: mxlan.PeerTimeout, KeepAlive: mxlan.KeepAlive})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := mx.Listen(ep, scaleMXStream)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var n atomic.Int64
	var held []*mx.Stream
	go func() {
		for {
			s, err := ln.Accept(context.Background())
			if err != nil {
				fmt.Fprintln(os.Stderr, "destination:", err)
				return
			}
			held = append(held, s)
			n.Add(1)
		}
	}()
	reportCount(&n, f[1])
	return 0 // not reached: reportCount runs until the child is killed
}

// scaleClientMXChild opens streams through the hub as node daemons do on
// an MX LAN and holds them idle: one MX endpoint, a stream per rank
// connection naming its source (127.19.x.2, a port each) and the hub's LAN
// address, then OPEN. spec: "hubudpport,hubLAN,count,dstlistfile,donefile";
// donefile gets "ok" or the first error.
func scaleClientMXChild(spec string) int {
	f := strings.Split(spec, ",")
	port, _ := strconv.Atoi(f[0])
	lan := netip.MustParseAddrPort(f[1])
	n, _ := strconv.Atoi(f[2])
	dsts, err := readDsts(f[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, ep, err := udpMXEndpoint(0, mx.Config{PeerTimeout: mxlan.PeerTimeout, KeepAlive: mxlan.KeepAlive})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	hub := mx.Addr{MAC: testnet.UDPMAC(port), EP: mxlan.Endpoint}
	streams := make([]*mx.Stream, n)
	openEach(n, f[4], func(i int) (err error) {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 19, byte(1 + i%200), 2}), uint16(10000+i/200))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		streams[i], err = mxOpenWith(ctx, ep, hub, lan, src, dsts[i%len(dsts)], scaleMXStream)
		return err
	})
	select {} // hold the streams until killed
}
