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
	tw *tryWrite
}

// tryWrite is TryWrite's callback and its argument and results, made once
// per connection: a closure per call escapes (RawConn is an interface) and
// would cost every small message three allocations. A stream has one
// writer at a time.
type tryWrite struct {
	fn   func(uintptr) bool
	p    []byte
	n    int
	werr error
}

// WrapTCP returns c as a relay Conn.
func WrapTCP(c *net.TCPConn) TCPConn {
	rc, _ := c.SyscallConn()
	tw := &tryWrite{}
	tw.fn = func(fd uintptr) bool {
		tw.n, tw.werr = rawWrite(int(fd), tw.p)
		return true
	}
	return TCPConn{TCPConn: c, rc: rc, tw: tw}
}

// Abort resets the connection: SO_LINGER 0 makes close send RST.
func (c TCPConn) Abort() error {
	c.SetLinger(0)
	return c.TCPConn.Close()
}

// Close ends the connection gracefully: it clears an SO_LINGER 0 that was
// set so that a gateway that dies mid-stream resets the connection (the
// kernel closes a dead process's sockets, and sends RST only with linger
// 0); a stream that really ended closes with FIN and unsent bytes still go
// out.
func (c TCPConn) Close() error {
	c.SetLinger(-1)
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
	t := c.tw
	t.p = p
	err := c.rc.Write(t.fn)
	n, werr := t.n, t.werr
	t.p, t.werr = nil, nil
	if err != nil {
		return 0, err
	}
	if werr == unix.EAGAIN || werr == unix.EINTR {
		return 0, nil
	}
	return max(n, 0), werr
}
