package relay

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/header"
)

// TestApplyClamp: a CLAMP frame sets TCP_WINDOW_CLAMP on the receiving
// side's socket, and CLAMP 0 lifts it.
func TestApplyClamp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		done <- c
	}()
	c1, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c2 := <-done
	defer c2.Close()
	l := &Link{conn: WrapTCP(c2.(*net.TCPConn)), cfg: Config{}}
	l.cfg.fillDefaults()
	l.log = l.cfg.Logger
	get := func() int {
		rc, _ := c2.(*net.TCPConn).SyscallConn()
		var v int
		rc.Control(func(fd uintptr) { v, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP) })
		return v
	}
	var b [4]byte
	header.PutU32(b[:], 300_000)
	if err := l.dispatch(header.Header{Type: header.TypeClamp, Length: 4}, b[:]); err != nil {
		t.Fatal(err)
	}
	if v := get(); v != 300_000 || l.Stats.PeerClamp.Load() != 300_000 {
		t.Fatalf("TCP_WINDOW_CLAMP %d after CLAMP 300000", v)
	}
	header.PutU32(b[:], 0)
	l.dispatch(header.Header{Type: header.TypeClamp, Length: 4}, b[:])
	if v := get(); v != clampLifted {
		t.Fatalf("TCP_WINDOW_CLAMP %d after CLAMP 0, want %d", v, clampLifted)
	}
	if err := l.dispatch(header.Header{Type: header.TypeClamp, Length: 4}, b[:3]); err == nil {
		t.Fatal("a 3-byte CLAMP body was accepted")
	}
}
