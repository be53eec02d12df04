package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/relay"
	"github.com/mpi5k/mpi5k/seal"
	"github.com/mpi5k/mpi5k/sitemap"
)

// echoBothWays runs streams through echo servers of both sites at once,
// two opened at each gateway, and checks every byte that comes back.
func echoBothWays(t *testing.T, a, b *testGW, echoA, echoB netip.AddrPort, size int, seed uint64) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		gw, src, dst := a, nodeA, echoB
		if i%2 == 1 {
			gw, src, dst = b, nodeB, echoA
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := echoCheck(gw.LANAddr(), src, dst, size, seed+uint64(i)); err != nil {
				errs <- fmt.Errorf("stream %d (%v to %v): %w", i, src, dst, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// echoCheck writes size random bytes to an echo server through gateway
// gw and compares what comes back with them.
func echoCheck(gw netip.AddrPort, src netip.Addr, dst netip.AddrPort, size int, seed uint64) error {
	c, err := lanOpen(gw, src, dst)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	want := make([]byte, size)
	testnet.Fill(mrand.New(mrand.NewPCG(seed, seed)), want)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(want)
		c.CloseWrite()
		werr <- err
	}()
	got, err := io.ReadAll(c)
	if err := <-werr; err != nil {
		return err
	}
	if err != nil {
		return fmt.Errorf("after %d of %d bytes: %w", len(got), size, err)
	}
	if i := firstDiff(got, want); i >= 0 || len(got) != size {
		return fmt.Errorf("%d bytes back of %d, first difference at %d", len(got), size, i)
	}
	return nil
}

// keyUpdates sums the key updates of g's sealed links: those g's own
// records made and those of the peer's it followed.
func keyUpdates(t *testing.T, g *testGW) (sent, received uint64, conns []*relay.SealedConn) {
	t.Helper()
	for _, l := range g.allLinks() {
		sc, ok := l.Conn().(*relay.SealedConn)
		if !ok {
			t.Fatalf("link conn is %T, want a relay.SealedConn", l.Conn())
		}
		s, r := sc.KeyUpdates()
		sent, received, conns = sent+s, received+r, append(conns, sc)
	}
	return sent, received, conns
}

// TestKeyUpdates: with keys that must update every 8 records or 256 KiB,
// streams in both directions come back byte for byte while both
// gateways move their own keys on many times and follow the other's.
// Then every WAN connection is reset: each link resumes on a new
// connection, whose new handshake gives keys that start again from
// phase 0, and the streams and the updates go on there.
func TestKeyUpdates(t *testing.T) {
	ks := newKeys(t, "a", "b")
	lanA, wanA, lanB, wanB := ports(t)
	m := keyedMap(t, lanA, wanA, lanB, wanB, ks)
	tweak := func(c *Config) {
		withKey(ks)(c)
		c.KeyUpdate = seal.Limits{Records: 8, Bytes: 256 << 10}
	}
	a := startGW(t, m, "a", tweak)
	b := startGW(t, m, "b", tweak)
	waitReady(t, a, b)
	echoA, echoB := testnet.Echo(t, nodeA), testnet.Echo(t, nodeB)
	size := 4 << 20
	if raceEnabled {
		size = 1 << 20
	}
	echoBothWays(t, a, b, echoA, echoB, size, 1)

	// A direction's updates are its sealer's: each end follows no more
	// than the other made. Each direction carried two streams' bytes and
	// two echoes, 4 × size, at most 256 KiB per key.
	as, ar, before := keyUpdates(t, a)
	bs, br, _ := keyUpdates(t, b)
	t.Logf("a sealed %d updates and followed %d, b %d and %d", as, ar, bs, br)
	least := uint64(4*size/(256<<10)) - 1
	if ar > bs || br > as || ar < least || br < least {
		t.Fatalf("updates: a sent %d and followed %d, b sent %d and followed %d; want at least %d followed each way",
			as, ar, bs, br, least)
	}

	for _, sc := range before {
		resetConn(sc.NetConn())
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, l := range append(a.allLinks(), b.allLinks()...) {
		for l.Down() || containsConn(before, l.Conn()) {
			if time.Now().After(deadline) {
				t.Fatal("links did not resume on new connections within 20 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	var resumes uint64
	for _, l := range a.allLinks() {
		resumes += l.ResumeStats().Resumes
	}
	if resumes < uint64(len(before)) {
		t.Fatalf("%d resumes after resetting %d connections", resumes, len(before))
	}
	echoBothWays(t, a, b, echoA, echoB, size, 2)
	as2, ar2, _ := keyUpdates(t, a)
	bs2, br2, _ := keyUpdates(t, b)
	t.Logf("after the resume: a sealed %d updates and followed %d, b %d and %d", as2, ar2, bs2, br2)
	if ar2 > bs2 || br2 > as2 || ar2 < least || br2 < least {
		t.Fatalf("updates on the resumed connections: a sent %d and followed %d, b sent %d and followed %d; want at least %d followed each way",
			as2, ar2, bs2, br2, least)
	}
}

func containsConn(cs []*relay.SealedConn, c net.Conn) bool {
	for _, sc := range cs {
		if net.Conn(sc) == c {
			return true
		}
	}
	return false
}

// TestKeyUpdateMixedBuilds: a gateway built before key updates offers
// mpi5k/2 alone. With it the handshake picks mpi5k/2, whichever end it
// is, the link works with keys that never change (no update however low
// the limits), and a --wan-encrypt mismatch is still named at both ends;
// two current gateways pick mpi5k/3.
func TestKeyUpdateMixedBuilds(t *testing.T) {
	ks := newKeys(t, "a", "b")
	lanA, wanA, lanB, wanB := ports(t)
	m := keyedMap(t, lanA, wanA, lanB, wanB, ks)
	lim := seal.Limits{Records: 1}
	auth := func(site string, mode seal.Mode, fixed bool) *peerAuth {
		a, err := newPeerAuth(m, mustSite(t, m, site), ks[site], "test", mode)
		if err != nil {
			t.Fatal(err)
		}
		a.limits, a.fixedKeys = lim, fixed
		return a
	}
	for _, c := range []struct {
		dialFixed, accFixed bool
		dialMode, accMode   seal.Mode
		want                string // the peers' protocol, or the error both name
	}{
		{false, false, seal.ModeEncrypt, seal.ModeEncrypt, "mpi5k/3"},
		{false, false, seal.ModeIntegrity, seal.ModeIntegrity, "mpi5k/3+integrity-only"},
		{true, false, seal.ModeEncrypt, seal.ModeEncrypt, "mpi5k/2"},
		{false, true, seal.ModeEncrypt, seal.ModeEncrypt, "mpi5k/2"},
		{false, true, seal.ModeIntegrity, seal.ModeIntegrity, "mpi5k/2+integrity-only"},
		{true, false, seal.ModeIntegrity, seal.ModeEncrypt, "--wan-encrypt"},
		{false, true, seal.ModeIntegrity, seal.ModeEncrypt, "--wan-encrypt"},
		{false, true, seal.ModeEncrypt, seal.ModeIntegrity, "--wan-encrypt"},
	} {
		name := fmt.Sprintf("dialer fixed %v %v, acceptor fixed %v %v", c.dialFixed, c.dialMode, c.accFixed, c.accMode)
		acc, dial := auth("b", c.accMode, c.accFixed), auth("a", c.dialMode, c.dialFixed)
		cc, sc := tcpPair(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		type result struct {
			conn *relay.SealedConn
			err  error
		}
		res := make(chan result, 1)
		go func() {
			conn, _, err := acc.handshake(ctx, sc, acc.acceptor(func(*sitemap.Site) bool { return true }), false)
			res <- result{conn, err}
		}()
		dconn, _, derr := dial.handshake(ctx, cc, dial.dialer(mustSite(t, m, "b")), true)
		r := <-res
		cancel()
		if strings.HasPrefix(c.want, "--") {
			for side, err := range map[string]error{"dialer": derr, "acceptor": r.err} {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Errorf("%s: the %s's error does not name %s: %v", name, side, c.want, err)
				}
			}
			cc.Close()
			sc.Close()
			continue
		}
		if derr != nil || r.err != nil {
			t.Fatalf("%s: %v / %v", name, derr, r.err)
		}
		// Three records each way under limits of one record per key.
		updating := !strings.HasPrefix(c.want, "mpi5k/2")
		for i := range 3 {
			for _, p := range [][2]*relay.SealedConn{{dconn, r.conn}, {r.conn, dconn}} {
				msg := fmt.Appendf(nil, "record %d", i)
				if _, err := p[0].Write(msg); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(p[1], got); err != nil || !bytes.Equal(got, msg) {
					t.Fatalf("%s: %q %v", name, got, err)
				}
			}
		}
		for side, conn := range map[string]*relay.SealedConn{"dialer": dconn, "acceptor": r.conn} {
			s, rc := conn.KeyUpdates()
			if want := map[bool]uint64{true: 2, false: 0}[updating]; s != want || rc != want {
				t.Errorf("%s (%s): the %s made %d updates and followed %d, want %d", name, c.want, side, s, rc, want)
			}
		}
		dconn.Close()
		r.conn.Close()
	}

	// Running gateways: either one an older build, streams cross intact.
	for _, old := range []string{"a", "b"} {
		t.Run("old "+old, func(t *testing.T) {
			lanA, wanA, lanB, wanB := ports(t)
			m := keyedMap(t, lanA, wanA, lanB, wanB, ks)
			tweak := func(c *Config) {
				withKey(ks)(c)
				c.KeyUpdate = lim
				c.fixedKeys = c.Site == old
			}
			a := startGW(t, m, "a", tweak)
			b := startGW(t, m, "b", tweak)
			waitReady(t, a, b)
			echoBothWays(t, a, b, testnet.Echo(t, nodeA), testnet.Echo(t, nodeB), 256<<10, 3)
			for _, g := range []*testGW{a, b} {
				if s, r, _ := keyUpdates(t, g); s != 0 || r != 0 {
					t.Fatalf("%d updates made and %d followed on mpi5k/2 links", s, r)
				}
			}
		})
	}
}
