package main

import (
	"io"
	"net"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/sitemap"
)

// listen listens on addr:0 or skips the test (127.0.2.x needs a Linux
// loopback).
func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", addr+":0")
	if err != nil {
		t.Skipf("listen on %s: %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func ap(l net.Listener) netip.AddrPort { return l.Addr().(*net.TCPAddr).AddrPort() }

// TestRelayPair: a rank of site1 opens a stream to a server of site2
// through two floorgw relays, as the shim does; the bytes go both ways,
// the server's shim learns the true source with PEER_QUERY, LISTEN is
// answered, and /metrics counts the stream's WAN bytes once it ends.
func TestRelayPair(t *testing.T) {
	lan1, wan1 := listen(t, "127.0.1.1"), listen(t, "127.0.1.1")
	lan2, wan2 := listen(t, "127.0.2.1"), listen(t, "127.0.2.1")
	m, err := sitemap.NewBuilder().
		AddSite("site1", 1, ap(lan1), ap(wan1)).AddNet("site1", netip.MustParsePrefix("127.0.1.0/24")).
		AddSite("site2", 2, ap(lan2), ap(wan2)).AddNet("site2", netip.MustParsePrefix("127.0.2.0/24")).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	var rs [2]*relay
	for i, name := range []string{"site1", "site2"} {
		s, _ := m.Site(name)
		if rs[i], err = newRelay(m, s, s.LAN, ""); err != nil {
			t.Fatal(err)
		}
	}
	go serve(lan1, rs[0].fromLAN)
	go serve(wan1, rs[0].fromWAN)
	go serve(lan2, rs[1].fromLAN)
	go serve(wan2, rs[1].fromWAN)

	// The server echoes one message and says whom it saw.
	srv := listen(t, "127.0.2.5")
	seen := make(chan [2]netip.AddrPort, 1)
	go func() {
		c, err := srv.Accept()
		if err != nil {
			return
		}
		seen <- [2]netip.AddrPort{c.RemoteAddr().(*net.TCPAddr).AddrPort(), c.LocalAddr().(*net.TCPAddr).AddrPort()}
		io.Copy(c, c)
		c.Close()
	}()

	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, 5)}}
	c, err := d.Dial("tcp", ap(lan1).String())
	if err != nil {
		t.Fatal(err)
	}
	src := c.LocalAddr().(*net.TCPAddr).AddrPort()
	body, err := header.AppendOpen(nil, &header.Open{Dst: ap(srv), Src: src})
	if err != nil {
		t.Fatal(err)
	}
	msg := strings.Repeat("floor ", 1000)
	if _, err := c.Write(append(header.AppendFrame(nil, header.TypeOpen, 0, body), msg...)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
		t.Fatalf("echo through the pair: %v, %d bytes right", err, len(got))
	}
	who := <-seen
	if who[0].Addr() != ap(lan2).Addr() {
		t.Fatalf("the server saw %v, want a connection from site2's relay %v", who[0], ap(lan2).Addr())
	}

	// The server's control connection: PEER_QUERY names the true source,
	// an unknown pair is not found, LISTEN is registered.
	ctl, err := net.Dial("tcp", ap(lan2).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	ask := func(q header.PeerQuery) header.PeerReply {
		t.Helper()
		if _, err := ctl.Write(header.AppendFrame(nil, header.TypePeerQuery, 7, header.AppendPeerQuery(nil, &q))); err != nil {
			t.Fatal(err)
		}
		h, p, err := header.ReadOne(ctl, 64)
		if err != nil || h.Type != header.TypePeerReply || h.Stream != 7 {
			t.Fatalf("PEER_REPLY: %v %v", h, err)
		}
		r, err := header.ParsePeerReply(p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := ask(header.PeerQuery{Seen: who[0], Local: who[1]}); !r.Found || r.Source != src || r.SiteID != 1 {
		t.Fatalf("PEER_REPLY %+v, want the true source %v of site 1", r, src)
	}
	if r := ask(header.PeerQuery{Seen: who[0], Local: netip.MustParseAddrPort("127.0.2.9:1")}); r.Found {
		t.Fatalf("PEER_REPLY for an unknown pair: %+v", r)
	}
	if _, err := ctl.Write(header.AppendFrame(nil, header.TypeListen, 8, header.AppendListen(nil, 7001))); err != nil {
		t.Fatal(err)
	}
	if h, p, err := header.ReadOne(ctl, 64); err != nil || h.Type != header.TypeListenReply || h.Stream != 8 || len(p) != 1 || p[0] != header.ListenOK {
		t.Fatalf("LISTEN_REPLY: %v %v %v", h, p, err)
	}

	// Once the stream ends, the relays forget it and count its bytes.
	c.Close()
	rec := httptest.NewRecorder()
	for i := 0; ; i++ {
		rs[1].mu.Lock()
		n := len(rs[1].peers)
		rs[1].mu.Unlock()
		tx := rs[0].bytes["site2"][0].Load()
		if n == 0 && tx == uint64(len(msg)) {
			break
		}
		if i == 500 {
			t.Fatalf("after the stream: %d peer records left, %d bytes counted sent (want 0, %d)", n, tx, len(msg))
		}
		time.Sleep(10 * time.Millisecond)
	}
	rs[0].metrics(rec, httptest.NewRequest("GET", "/metrics", nil))
	out := rec.Body.String()
	for _, want := range []string{"process_cpu_seconds_total ", `mpi5k_wan_bytes_total{dir="tx",peer="site2"} 6000`, `mpi5k_wan_bytes_total{dir="rx",peer="site2"} 6000`} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, out)
		}
	}
}
