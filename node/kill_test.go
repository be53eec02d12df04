package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/gateway"
	"github.com/mpi5k/mpi5k/gateway/mxlan"
	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/mx"
)

// Short MX timeouts for these tests: a killed peer is noticed within
// about a second instead of mxlan.PeerTimeout.
var killCfg = mx.Config{PeerTimeout: time.Second, KeepAlive: 200 * time.Millisecond}

// TestKilledDaemonChild is the node daemon that TestKilledDaemon runs in
// a child process and kills; on its own it does nothing.
func TestKilledDaemonChild(t *testing.T) {
	if os.Getenv("MPI5K_NODE_CHILD") == "" {
		t.Skip("run by TestKilledDaemon")
	}
	udp, _ := strconv.Atoi(os.Getenv("MPI5K_NODE_CHILD_UDP"))
	gw, _ := strconv.Atoi(os.Getenv("MPI5K_NODE_CHILD_GW"))
	link, err := testnet.OpenUDPLink(udp)
	if err != nil {
		t.Fatal(err)
	}
	e, err := mx.New(link, killCfg)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := e.Open(mxlan.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Addr: nodeAddr, NoResume: true, Listen: netip.MustParseAddrPort(os.Getenv("MPI5K_NODE_CHILD_LISTEN")),
		Gateways: []Gateway{{LAN: gwLAN, MX: mx.Addr{MAC: testnet.UDPMAC(gw), EP: mxlan.Endpoint}}}, EP: ep})
	if err != nil {
		t.Fatal(err)
	}
	d.Run(context.Background())
}

// TestKilledDaemon: when the node daemon dies (SIGKILL) under connected
// ranks, each rank's connection fails with a reset at once (an end of
// file would make a cut stream look complete), the gateway's streams
// from it fail within the MX peer timeout, and a restarted daemon on the
// same ports carries new connections.
func TestKilledDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	link, err := testnet.OpenUDPLink(0)
	if err != nil {
		t.Fatal(err)
	}
	tr := &gateway.MXTransport{EP: endpoint(t, link, killCfg)}
	ln, err := tr.Listen(gwLAN)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The gateway side: after OPEN, echo; report how each stream ended.
	ended := make(chan error, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				if _, _, err := header.ReadOne(c, header.MaxPayload); err != nil {
					ended <- err
					return
				}
				_, err := io.Copy(c, c)
				if err == nil {
					err = io.EOF
				}
				ended <- err
				c.Close()
			}()
		}
	}()

	free := func(network string) int {
		if network == "udp" {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			return c.LocalAddr().(*net.UDPAddr).Port
		}
		l, err := net.Listen("tcp", "127.0.0.3:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	listen := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), uint16(free("tcp")))
	udp := free("udp")
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestKilledDaemonChild$")
		cmd.Env = append(os.Environ(), "MPI5K_NODE_CHILD=1", "MPI5K_NODE_CHILD_UDP="+strconv.Itoa(udp),
			"MPI5K_NODE_CHILD_GW="+strconv.Itoa(link.Port()),
			"MPI5K_NODE_CHILD_LISTEN="+listen.String())
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	// rank connects through the daemon and checks that bytes come back.
	rank := func() (*net.TCPConn, error) {
		var c net.Conn
		var err error
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if c, err = net.Dial("tcp", listen.String()); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			return nil, err
		}
		body, _ := header.AppendOpen(nil, &header.Open{Dst: netip.MustParseAddrPort("10.8.0.5:7000"),
			Src: addrPort(c.LocalAddr()), Label: "test"})
		c.Write(header.AppendFrame(nil, header.TypeOpen, 0, body))
		c.Write([]byte("ping"))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var b [4]byte
		if _, err := io.ReadFull(c, b[:]); err != nil || string(b[:]) != "ping" {
			c.Close()
			return nil, fmt.Errorf("echo through the daemon: %q, %v", b, err)
		}
		c.SetReadDeadline(time.Time{})
		return c.(*net.TCPConn), nil
	}

	child := start()
	var ranks []*net.TCPConn
	for range 4 {
		c, err := rank()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ranks = append(ranks, c)
	}
	child.Process.Signal(syscall.SIGKILL)
	child.Wait()
	for i, c := range ranks {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 16))
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("rank connection %d after the daemon was killed: %v, want a reset", i, err)
		}
	}
	for i := range ranks {
		select {
		case err := <-ended:
			if errors.Is(err, io.EOF) {
				t.Errorf("gateway stream %d ended cleanly after the daemon was killed", i)
			}
		case <-time.After(killCfg.PeerTimeout + 5*time.Second):
			t.Fatalf("gateway stream %d still open %v after the daemon was killed", i, killCfg.PeerTimeout+5*time.Second)
		}
	}

	start()
	c, err := rank()
	if err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	c.Close()
}
