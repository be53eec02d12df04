package relay

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// TCPConn adapts a *net.TCPConn to Conn, BuffersWriter and TryWriter.
type TCPConn struct {
	*net.TCPConn
	rc syscall.RawConn
}

// WrapTCP returns c as a relay Conn.
func WrapTCP(c *net.TCPConn) TCPConn {
	rc, _ := c.SyscallConn()
	return TCPConn{TCPConn: c, rc: rc}
}

// Abort resets the connection: SO_LINGER 0 makes close send RST.
func (c TCPConn) Abort() error {
	c.SetLinger(0)
	return c.TCPConn.Close()
}

// WriteBuffers writes b with one writev where the kernel allows.
func (c TCPConn) WriteBuffers(b *net.Buffers) (int64, error) { return b.WriteTo(c.TCPConn) }

// TryWrite makes one non-blocking write(2) attempt (Go's sockets are
// O_NONBLOCK; the callback never asks the poller to wait).
func (c TCPConn) TryWrite(p []byte) (int, error) {
	if c.rc == nil {
		return 0, nil
	}
	var n int
	var werr error
	if err := c.rc.Write(func(fd uintptr) bool {
		n, werr = rawWrite(int(fd), p)
		return true
	}); err != nil {
		return 0, err
	}
	if werr == unix.EAGAIN || werr == unix.EINTR {
		return 0, nil
	}
	return max(n, 0), werr
}
