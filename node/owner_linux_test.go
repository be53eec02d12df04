package node

import (
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/header"
)

// listenAs opens a TCP socket listening on a:0 owned by uid (root only:
// a socket belongs to its creator's fsuid) and returns its port.
func listenAs(t *testing.T, a netip.Addr, uid int) uint16 {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	old, err := unix.SetfsuidRetUid(uid)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	unix.SetfsuidRetUid(old)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: a.As4()}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 8); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return uint16(sa.(*unix.SockaddrInet4).Port)
}

// TestListenOwner: a user of the node registers (LISTEN through the node
// daemon) a port where another user's service listens, or where nothing
// listens: the daemon answers the refusal itself and the gateway hears
// nothing; the user's own listener is registered.
func TestListenOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root only: the test makes a socket of another user")
	}
	d, tr := lan(t, 0)
	ln, err := tr.Listen(gwLAN)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var heard atomic.Int32 // LISTENs the gateway got
	go func() {
		for {
			g, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer g.Close()
				for {
					h, _, err := header.ReadOne(g, header.MaxControl)
					if err != nil {
						return
					}
					heard.Add(1)
					g.Write(header.AppendFrame(nil, header.TypeListenReply, h.Stream, []byte{header.ListenOK}))
				}
			}()
		}
	}()
	theirs := listenAs(t, nodeAddr, 65534)
	mine := listenAs(t, nodeAddr, 0)

	c, err := net.Dial("tcp", d.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ask := func(id uint32, port uint16) uint8 {
		t.Helper()
		c.Write(header.AppendFrame(nil, header.TypeListen, id, header.AppendListen(nil, port)))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		h, body, err := header.ReadOne(c, 64)
		if err != nil || h.Type != header.TypeListenReply || h.Stream != id || len(body) != 1 {
			t.Fatalf("LISTEN %d answered %v %d % x, %v", port, h.Type, h.Stream, body, err)
		}
		return body[0]
	}
	if code := ask(1, theirs); code != header.ListenOwner {
		t.Errorf("LISTEN of another user's port answered %d, want %d", code, header.ListenOwner)
	}
	if code := ask(2, 9); code != header.ListenOwner {
		t.Errorf("LISTEN of a port nothing listens on answered %d, want %d", code, header.ListenOwner)
	}
	if n := heard.Load(); n != 0 {
		t.Errorf("the gateway heard %d refused LISTENs", n)
	}
	if code := ask(3, mine); code != header.ListenOK {
		t.Errorf("LISTEN of the user's own port answered %d", code)
	}
	if n := heard.Load(); n != 1 {
		t.Errorf("the gateway heard %d LISTENs, want 1", n)
	}
}
