package relay

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/seal"
)

// SealedConn is a WAN link's connection carrying the records of package
// seal: the gateway makes it once TLS has authenticated the peer and
// agreed on keys, and from then on the link writes each batch as one
// record on the raw socket and reads records there, on the poller thread
// like a plaintext link. It deliberately does not embed the socket: a
// promoted method (net.Buffers' writev path, ReadFrom) would move bytes
// past the seal.
type SealedConn struct {
	c  net.Conn // the socket (a *net.TCPConn; tests use others)
	sc syscall.Conn

	wmu  sync.Mutex // one writer: the link's (l.writing) or a HELLO's
	s    *seal.Sealer
	out  []byte // the records being written
	pend []byte // the unsent end of out, after a non-blocking write

	one [1][]byte // tryWritev's iovec: a literal would escape, an allocation per message

	r  *seal.Reader // the link reader's (recv.go), on whichever thread runs it
	o  *seal.Opener // r's
	rd func([]byte) (int, error)

	// The key updates sealed and followed so far (mpi5k/3), for readers
	// other than the writer and the link reader.
	sentUpdates, recvUpdates atomic.Uint64

	// Peer is what authenticated the far end, for the connection's owner
	// (the gateway keeps the key its peer proved); relay never reads it.
	Peer any
}

// NewSealedConn runs records sealed by s and opened by o over c.
func NewSealedConn(c net.Conn, s *seal.Sealer, o *seal.Opener) *SealedConn {
	sc := &SealedConn{c: c, s: s, r: seal.NewReader(o), o: o}
	sc.sc, _ = c.(syscall.Conn)
	sc.rd = c.Read
	return sc
}

// Read returns batch bytes, blocking until a record has arrived.
func (c *SealedConn) Read(p []byte) (int, error) { return c.readWith(p, c.rd) }

// readWith returns batch bytes read with read, the poller thread's
// non-blocking read of the socket.
func (c *SealedConn) readWith(p []byte, read func([]byte) (int, error)) (int, error) {
	n, err := c.r.Read(p, read)
	if u := c.o.Updates(); u != c.recvUpdates.Load() {
		c.recvUpdates.Store(u)
	}
	return n, err
}

// KeyUpdates reports how many times this end has moved its own key on
// and followed the peer's (mpi5k/3; 0 for keys that never change). A
// connection starts from its handshake's keys: a resumed link's count
// starts again.
func (c *SealedConn) KeyUpdates() (sent, received uint64) {
	return c.sentUpdates.Load(), c.recvUpdates.Load()
}

// sealed notes the sealer's updates after an Append.
func (c *SealedConn) sealed() {
	if u := c.s.Updates(); u != c.sentUpdates.Load() {
		c.sentUpdates.Store(u)
	}
}

// Write seals p as one record and writes it.
func (c *SealedConn) Write(p []byte) (int, error) {
	if err := c.writev([][]byte{p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writev writes what an earlier non-blocking write left, then iov sealed
// as one record, blocking until the socket took it all.
func (c *SealedConn) writev(iov [][]byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.flushLocked(); err != nil {
		return err
	}
	out, err := c.s.Append(c.out[:0], iov)
	c.sealed()
	if err != nil {
		return err
	}
	c.out = out
	if len(out) > 0 {
		_, err = c.c.Write(out)
	}
	c.release()
	return err
}

// tryWritev seals iov as one record and makes one non-blocking write of
// it with write (the poller thread's); pending reports that the socket
// took only part, whose rest the next writev sends first. Nothing may be
// pending when it is called.
func (c *SealedConn) tryWritev(iov [][]byte, write func([][]byte) (int, error)) (pending bool, err error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if len(c.pend) > 0 {
		return false, errors.New("relay: sealed write with a record still pending")
	}
	out, err := c.s.Append(c.out[:0], iov)
	c.sealed()
	if err != nil {
		return false, err
	}
	c.out = out
	c.one[0] = out
	n, err := write(c.one[:])
	c.one[0] = nil
	if err != nil {
		return false, err
	}
	if n < len(out) {
		c.pend = out[n:]
		return true, nil
	}
	c.release()
	return false, nil
}

// flushLocked writes the pending end of a record.
func (c *SealedConn) flushLocked() error {
	if len(c.pend) == 0 {
		return nil
	}
	_, err := c.c.Write(c.pend)
	c.pend = nil
	c.release()
	return err
}

// release drops a large out buffer: a one-off batch (a replay after a
// resume) does not pin its size.
func (c *SealedConn) release() {
	if cap(c.out) > 4*seal.MaxRecord {
		c.out = nil
	}
}

// alert tells the peer that a record it sent failed (seal.Alert), with
// one non-blocking write straight to the socket: a writer blocked in
// wmu must not hold it up, and if the alert lands inside a record being
// written, that record fails at the peer, which tells it the same.
func (c *SealedConn) alert() {
	if c.sc == nil {
		return
	}
	rc, err := c.sc.SyscallConn()
	if err != nil {
		return
	}
	rc.Write(func(fd uintptr) bool {
		rawWrite(int(fd), seal.Alert[:])
		return true
	})
}

// NetConn is the socket, for relay.TCPOf (TCP_INFO, socket options).
func (c *SealedConn) NetConn() net.Conn { return c.c }

// SyscallConn is the socket's: the poller thread waits for it and reads
// it raw (records, which readWith opens); resetSeen reads its TCP state.
func (c *SealedConn) SyscallConn() (syscall.RawConn, error) {
	if c.sc == nil {
		return nil, errors.New("relay: the sealed connection has no socket")
	}
	return c.sc.SyscallConn()
}

// Close closes the socket.
func (c *SealedConn) Close() error { return c.c.Close() }

func (c *SealedConn) LocalAddr() net.Addr                { return c.c.LocalAddr() }
func (c *SealedConn) RemoteAddr() net.Addr               { return c.c.RemoteAddr() }
func (c *SealedConn) SetDeadline(t time.Time) error      { return c.c.SetDeadline(t) }
func (c *SealedConn) SetReadDeadline(t time.Time) error  { return c.c.SetReadDeadline(t) }
func (c *SealedConn) SetWriteDeadline(t time.Time) error { return c.c.SetWriteDeadline(t) }

// writeBatch writes iov to a link's connection: one record on a sealed
// one, one writev on a socket.
func writeBatch(conn net.Conn, iov *net.Buffers) error {
	if sc, ok := conn.(*SealedConn); ok {
		err := sc.writev(*iov)
		*iov = nil
		return err
	}
	_, err := iov.WriteTo(conn)
	return err
}

// readerSize is the frame reader's buffer for a link on conn (0: the
// default). A sealed link's holds a whole record, which then opens
// straight into it: a record larger than the buffer is opened in the
// SealedConn's and copied over: a second copy of each bulk byte
// received (bench/figures/security).
func readerSize(conn net.Conn) int {
	if _, ok := conn.(*SealedConn); ok {
		return seal.MaxRecord + header.DefaultReaderBuffer
	}
	return 0
}
