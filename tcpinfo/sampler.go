package tcpinfo

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Handler receives every sample of a connection with the events derived
// from it. It runs on the sampling goroutine, must not call Sample or
// SampleAll, and must not keep in or ev (reused after it returns).
type Handler func(c *Conn, at time.Time, in *Info, ev []Event)

// Sampler samples a set of sockets: on demand (Sample, SampleAll) and
// periodically (Run). One sample costs one getsockopt and no allocation.
type Sampler struct {
	fn Handler

	mu    sync.Mutex // guards conns
	conns []*Conn

	// Scratch of the sampling path; sampleMu serialises SampleAll/Sample.
	sampleMu sync.Mutex
	raw      Raw
	info     Info
	ev       []Event
	snap     []*Conn
}

// Conn is one sampled socket.
type Conn struct {
	Name string

	s   *Sampler
	fd  int
	rc  syscall.RawConn
	ctl func(fd uintptr) // built once: Control with a fresh closure would allocate
	err error            // result of the read inside ctl

	mu   sync.Mutex // guards t, gone
	t    Tracker
	gone error
}

// NewSampler returns a Sampler calling fn (may be nil) for every sample.
func NewSampler(fn Handler) *Sampler {
	return &Sampler{fn: fn, ev: make([]Event, 0, 16)}
}

// AddFD samples socket fd. The caller keeps fd open until Remove: a closed
// and reused fd number would be sampled as if it were the same socket.
func (s *Sampler) AddFD(name string, fd int) *Conn {
	c := &Conn{Name: name, s: s, fd: fd}
	c.t.CongestionControl, _ = CongestionControl(fd)
	s.add(c)
	return c
}

// AddConn samples a connection (e.g. *net.TCPConn); once it is closed the
// next sample fails with net.ErrClosed and drops it from the set.
func (s *Sampler) AddConn(name string, sc syscall.Conn) (*Conn, error) {
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	c := &Conn{Name: name, s: s, fd: -1, rc: rc}
	rc.Control(func(fd uintptr) { c.t.CongestionControl, _ = CongestionControl(int(fd)) })
	c.ctl = func(fd uintptr) { c.err = Read(int(fd), &s.raw, &s.info) }
	s.add(c)
	return c, nil
}

func (s *Sampler) add(c *Conn) {
	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.mu.Unlock()
}

// Remove stops sampling c (take a last Sample first to record the close).
func (s *Sampler) Remove(c *Conn) {
	s.mu.Lock()
	if i := slices.Index(s.conns, c); i >= 0 {
		s.conns = slices.Delete(s.conns, i, i+1)
	}
	s.mu.Unlock()
}

// Len is the number of sampled sockets.
func (s *Sampler) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Sample samples c now.
func (s *Sampler) Sample(c *Conn) error {
	s.sampleMu.Lock()
	defer s.sampleMu.Unlock()
	return s.sampleLocked(c, time.Now())
}

// SampleAll samples every socket once (one timestamp for the round) and
// returns how many were sampled. Sockets that are gone (closed connection,
// bad fd, not TCP any more) are dropped from the set.
func (s *Sampler) SampleAll() int {
	s.sampleMu.Lock()
	defer s.sampleMu.Unlock()
	s.mu.Lock()
	s.snap = append(s.snap[:0], s.conns...)
	s.mu.Unlock()
	at := time.Now()
	n := 0
	for _, c := range s.snap {
		if err := s.sampleLocked(c, at); err != nil {
			if gone(err) {
				s.Remove(c)
			}
			continue
		}
		n++
	}
	clear(s.snap) // do not keep removed conns alive
	return n
}

func gone(err error) bool {
	return errors.Is(err, ErrNotTCP) || errors.Is(err, unix.EBADF) || errors.Is(err, unix.ENOTSOCK) ||
		errors.Is(err, net.ErrClosed)
}

func (s *Sampler) sampleLocked(c *Conn, at time.Time) error {
	var err error
	if c.rc != nil {
		if err = c.rc.Control(c.ctl); err == nil {
			err = c.err
		}
	} else {
		err = Read(c.fd, &s.raw, &s.info)
	}
	c.mu.Lock()
	if err != nil {
		c.gone = err
		c.mu.Unlock()
		return err
	}
	s.ev = c.t.Update(at, &s.info, s.ev[:0])
	c.mu.Unlock()
	if s.fn != nil {
		s.fn(c, at, &s.info, s.ev)
	}
	return nil
}

// Run samples every socket every interval until ctx is done.
func (s *Sampler) Run(ctx context.Context, every time.Duration) {
	tk := time.NewTicker(every)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
			s.SampleAll()
		}
	}
}

// Counters returns what was derived for c so far.
func (c *Conn) Counters() Counters {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t.C
}

// Last returns c's latest sample and its time.
func (c *Conn) Last() (Info, time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t.Last()
}

// Err is the error of the latest failed sample (nil if none).
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gone
}
