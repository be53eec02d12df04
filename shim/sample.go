package main

/*
#include "shim.h"
*/
import "C"

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpi5k/mpi5k/tcpinfo"
	"github.com/mpi5k/mpi5k/trace"
)

// TCP_INFO sampling in trace mode (docs/tracing.md): the application's TCP
// sockets are sampled right after connect/accept, every MPI5K_TRACE_SAMPLE
// (default 100 ms; 0 or "off" disables) and right before close, so a run
// without gateways yields per-connection counters (fast vs RTO
// retransmits, RTOs, idle restarts, derived by tcpinfo.Tracker) comparable
// with the gateways' own. They go to the trace file as KindSample records
// (docs/trace-format.md).
//
// Nothing here runs on the data path: the periodic round has its own
// goroutine; the open and close samples come from C hooks that run only
// while tracing, for TCP sockets, in connect/accept and close (one C->Go
// call and one getsockopt, a few µs, measured in docs/tracing.md).

const defaultSampleEvery = 100 * time.Millisecond

// sampledConn is one sampled socket.
type sampledConn struct {
	t   tcpinfo.Tracker
	ino uint64 // socket inode: an fd number reused for another socket is a new connection
}

type sampler struct {
	mu    sync.Mutex
	on    bool
	fd    int // trace file
	conns map[int32]*sampledConn
	raw   tcpinfo.Raw
	info  tcpinfo.Info
	ev    []tcpinfo.Event
	buf   []byte
	fds   []int32
}

var smp sampler

// sampleEvery reads MPI5K_TRACE_SAMPLE: a duration ("50ms") or seconds.
func sampleEvery() (time.Duration, error) {
	switch v := os.Getenv("MPI5K_TRACE_SAMPLE"); v {
	case "":
		return defaultSampleEvery, nil
	case "0", "off":
		return 0, nil
	default:
		d, err := parseDuration(v)
		if err != nil || d < time.Millisecond {
			return 0, errSampleEvery(v)
		}
		return d, nil
	}
}

type errSampleEvery string

func (e errSampleEvery) Error() string {
	return "MPI5K_TRACE_SAMPLE=" + string(e) + ": want a duration of at least 1ms (e.g. 100ms), or 0/off"
}

// startSampling starts sampling into the trace file fd, once the file
// header is written (startTrace).
func startSampling(fd int) {
	every, err := sampleEvery()
	if err != nil {
		logf(levelError, "TCP_INFO sampling off: %v", err)
		return
	}
	if every == 0 {
		return
	}
	smp.mu.Lock()
	smp.on, smp.fd = true, fd
	smp.conns = map[int32]*sampledConn{}
	smp.ev = make([]tcpinfo.Event, 0, 16)
	smp.mu.Unlock()
	go sampleLoop(every)
}

func sampleLoop(every time.Duration) {
	ms := C.int(max(every.Milliseconds(), 1))
	for {
		C.mpi5k_sleep_ms(ms) // not a Go timer: it would start the netpoller (see mpi5k_sleep_ms)
		if C.mpi5k_trace_wanted() == 0 {
			return
		}
		smp.mu.Lock()
		smp.fds = smp.fds[:0]
		for fd := range smp.conns {
			smp.fds = append(smp.fds, fd)
		}
		for _, fd := range smp.fds {
			smp.sampleLocked(fd, trace.SamplePeriodic)
		}
		smp.flushLocked()
		smp.mu.Unlock()
	}
}

// mpi5kGoSampleOpen: C hook after a traced connect/accept of TCP socket fd.
//
//export mpi5kGoSampleOpen
func mpi5kGoSampleOpen(fd C.int) { smp.hook(int32(fd), trace.SampleOpen) }

// mpi5kGoSampleClose: C hook right before a traced TCP socket fd is closed.
//
//export mpi5kGoSampleClose
func mpi5kGoSampleClose(fd C.int) { smp.hook(int32(fd), trace.SampleClose) }

func (s *sampler) hook(fd int32, when trace.SampleWhen) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.on {
		return
	}
	if when == trace.SampleOpen {
		delete(s.conns, fd) // a new connection on this fd: fresh baseline
	}
	s.sampleLocked(fd, when)
	if when == trace.SampleClose {
		delete(s.conns, fd)
	}
	s.flushLocked()
}

// sampleLocked takes one sample of fd and queues its record. A gone fd is
// forgotten; a different socket behind the same number (closed behind the
// shim's back and reused) starts over.
func (s *sampler) sampleLocked(fd int32, when trace.SampleWhen) {
	var st unix.Stat_t
	if err := unix.Fstat(int(fd), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		delete(s.conns, fd)
		return
	}
	if err := tcpinfo.Read(int(fd), &s.raw, &s.info); err != nil {
		delete(s.conns, fd)
		return
	}
	c := s.conns[fd]
	// Listening sockets are TCP too, and a socket closed without ever
	// connecting has nothing to say: neither is a connection.
	const tcpClose, tcpListen = 7, 10
	if s.info.State == tcpListen || s.info.State == tcpClose && (c == nil || c.ino != st.Ino) {
		delete(s.conns, fd)
		return
	}
	if c == nil || c.ino != st.Ino {
		c = &sampledConn{ino: st.Ino}
		c.t.CongestionControl, _ = tcpinfo.CongestionControl(int(fd))
		s.conns[fd] = c
	}
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	s.ev = c.t.Update(time.Now(), &s.info, s.ev[:0])
	in, k := &s.info, &c.t.C
	r := trace.Record{Mono: uint64(ts.Nano()), FD: fd, Kind: trace.KindSample, TCP: trace.TCPSample{
		Cwnd: in.SndCwnd, Ssthresh: in.SndSsthresh, Unacked: in.Unacked, MSS: in.SndMSS, RTT: in.RTT,
		TotalRetrans: in.TotalRetrans, RetransFast: sat32(k.RetransFast), RetransRTO: sat32(k.RetransRTO),
		RTOs: sat16(k.RTOs), IdleRestarts: sat16(k.IdleRestarts), CAState: in.CAState, When: when,
	}}
	s.buf = r.Encode(s.buf)
}

// flushLocked writes the queued records. The C flusher writes the same file
// from another thread: a write(2) to a regular file is atomic with respect
// to the shared offset, so whole records never interleave (the analysis
// sorts by time).
func (s *sampler) flushLocked() {
	b := s.buf
	for len(b) > 0 {
		n, err := unix.Write(s.fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			break
		}
		b = b[n:]
	}
	s.buf = s.buf[:0]
}

func sat32(v uint64) uint32 { return uint32(min(v, 0xffffffff)) }
func sat16(v uint64) uint16 { return uint16(min(v, 0xffff)) }
