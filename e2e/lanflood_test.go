package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
)

// TestGatewayLANFlood: the real mpi5k-gateway on loopback (no namespace
// needed: Linux routes all of 127/8 to lo), site a on 127.1/16 and b on
// 127.2/16, started with 4096 descriptors (MaxLANConns 2048). One node
// of site a, 127.1.0.66, opens 1024 connections whose first frame
// declares a 1 MiB PAD and sends half of it, then 3000 control
// connections (PEER_QUERY), and holds them all. The gateway's VmRSS stays within floodRSS of its idle
// figure, and a rank on another node, 127.1.0.10, still opens a stream
// through it and gets its bytes back. The figures are logged: idle, under
// the flood, after it.
func TestGatewayLANFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two gateways and opens 4000 connections")
	}
	const floodRSS = 64 << 20
	bin := gatewayBinary(t)
	dir := t.TempDir()
	gwA, gwB := netip.MustParseAddr("127.1.0.1"), netip.MustParseAddr("127.2.0.1")
	lanA := netip.AddrPortFrom(gwA, loopbackPort(t, gwA))
	mapPath := filepath.Join(dir, "flood.map")
	text := fmt.Sprintf("site a id=1 lan=%v wan=%v\nsite b id=2 lan=%v wan=%v\nnet a 127.1.0.0/16\nnet b 127.2.0.0/16\n",
		lanA, netip.AddrPortFrom(gwA, loopbackPort(t, gwA)),
		netip.AddrPortFrom(gwB, loopbackPort(t, gwB)), netip.AddrPortFrom(gwB, loopbackPort(t, gwB)))
	if err := os.WriteFile(mapPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	start := func(site string) *exec.Cmd {
		ready := filepath.Join(dir, site+".ready")
		argv := []string{bin, "--map", mapPath, "--site", site, "--ready-file", ready, "--log-level", "error",
			"--wan-allow-ports", "any", "--wan-keep-warm=false"}
		// A fixed descriptor limit, so the defaults are the same on every
		// machine: MaxLANConns 2048, MaxSourceControl 256.
		if p, err := exec.LookPath("prlimit"); err == nil {
			argv = append([]string{p, "--nofile=4096:4096", "--"}, argv...)
		}
		g := exec.Command(argv[0], argv[1:]...)
		g.Stderr = os.Stderr
		if err := g.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Process.Signal(os.Interrupt); g.Wait() })
		return g
	}
	start("b")
	ga := start("a")
	pid := ga.Process.Pid
	for _, site := range []string{"a", "b"} {
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(dir, site+".ready")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("gateway %s did not become ready", site)
			}
		}
	}

	dst := testnet.Echo(t, netip.MustParseAddr("127.2.0.10"))
	rank := netip.MustParseAddr("127.1.0.10")
	if err := floodOpen(lanA, rank, dst); err != nil {
		t.Fatalf("a stream before the flood: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	idleRSS, idleFDs := procRSS(pid), int(procFDs(pid))

	attacker := netip.MustParseAddr("127.1.0.66")
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	peakRSS, peakFDs := idleRSS, idleFDs
	sample := func() {
		peakRSS, peakFDs = max(peakRSS, procRSS(pid)), max(peakFDs, int(procFDs(pid)))
	}
	// Half of each PAD is sent, so that a gateway that took the
	// declared length has it resident, not only reserved.
	pad := make([]byte, header.Size+header.MaxPayload/2)
	header.Header{Type: header.TypePad, Length: header.MaxPayload}.Encode(pad)
	for i := range 1024 {
		if c := floodDial(t, lanA, attacker); c != nil {
			c.SetWriteDeadline(time.Now().Add(2 * time.Second))
			c.Write(pad) // fails once the gateway has reset it
			held = append(held, c)
		}
		if i%128 == 0 {
			sample()
		}
	}
	q := header.PeerQuery{Seen: netip.AddrPortFrom(gwA, 1), Local: netip.AddrPortFrom(attacker, 1)}
	for i := range 3000 {
		if c := floodDial(t, lanA, attacker); c != nil {
			c.Write(header.AppendFrame(nil, header.TypePeerQuery, uint32(i+1), header.AppendPeerQuery(nil, &q)))
			held = append(held, c)
		}
		if i%256 == 0 {
			sample()
		}
	}
	for range 20 {
		sample()
		time.Sleep(100 * time.Millisecond)
	}
	if err := floodOpen(lanA, rank, dst); err != nil {
		t.Errorf("a rank's stream from another node during the flood: %v", err)
	}
	sample()
	for _, c := range held {
		c.Close()
	}
	held = nil
	time.Sleep(2 * time.Second)
	afterRSS, afterFDs := procRSS(pid), int(procFDs(pid))
	t.Logf("gateway a (pid %d, 4096 descriptors): VmRSS idle %.1f MiB, under the flood at most %.1f MiB, after %.1f MiB; descriptors idle %d, under the flood at most %d, after %d",
		pid, mib(idleRSS), mib(peakRSS), mib(afterRSS), idleFDs, peakFDs, afterFDs)
	if peakRSS > idleRSS+floodRSS {
		t.Errorf("VmRSS %.1f MiB under the flood: more than idle (%.1f MiB) + %d MiB", mib(peakRSS), mib(idleRSS), floodRSS>>20)
	}
	if err := floodOpen(lanA, rank, dst); err != nil {
		t.Errorf("a stream after the flood: %v", err)
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// loopbackPort is a free TCP port on a.
func loopbackPort(t *testing.T, a netip.Addr) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(a, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// floodDial connects from src to gw; nil if the gateway reset the
// connection before the connect returned.
func floodDial(t *testing.T, gw netip.AddrPort, src netip.Addr) net.Conn {
	c, err := net.DialTCP("tcp", &net.TCPAddr{IP: src.AsSlice()}, net.TCPAddrFromAddrPort(gw))
	if errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// floodOpen opens a stream from src through the gateway at gw to the echo
// server dst, as the shim does, and checks its bytes come back.
func floodOpen(gw netip.AddrPort, src netip.Addr, dst netip.AddrPort) error {
	c, err := net.DialTCP("tcp", &net.TCPAddr{IP: src.AsSlice()}, net.TCPAddrFromAddrPort(gw))
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	body, err := header.AppendOpen(nil, &header.Open{Dst: dst, Src: c.LocalAddr().(*net.TCPAddr).AddrPort(), Label: "flood"})
	if err != nil {
		return err
	}
	msg := []byte("through the gateway")
	if _, err := c.Write(append(header.AppendFrame(nil, header.TypeOpen, 0, body), msg...)); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if string(got) != string(msg) {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}
