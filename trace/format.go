// Package trace defines the binary trace file the shim writes when
// MPI5K_TRACE is set (docs/trace-format.md): a 128-byte header followed by
// fixed 64-byte records, all little-endian. The shim's C layer writes the
// records as raw structs (shim/shim.h struct mpi5k_rec); this package is the
// one Go encoder and decoder of the format.
package trace

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"
)

// Sizes and identity of the format.
const (
	Magic      = "MPI5KTRC"
	Version    = 1
	HeaderSize = 128
	RecordSize = 64
	maxHost    = 56
	maxSite    = 32
)

// MaxRank bounds the ranks a header can hold (three bytes, 0 = none).
const MaxRank = 1<<24 - 1

// Errors returned by the decoders; compare with errors.Is.
var (
	ErrMagic   = errors.New("trace: not an mpi5k trace file")
	ErrVersion = errors.New("trace: unsupported trace version")
	ErrFormat  = errors.New("trace: malformed trace")
)

// Header starts every trace file.
type Header struct {
	Wall   int64  // wall clock (Unix ns) read together with Mono
	Mono   uint64 // CLOCK_MONOTONIC ns at the anchor
	PID    uint32
	SiteID uint8 // 0 when the site was unknown
	// Rank is the process's MPI rank in MPI_COMM_WORLD as its launcher
	// announced it (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK,
	// SLURM_PROCID), -1 when none did. Stored as rank+1 in the three bytes
	// after the site id, so files written before it read as -1.
	Rank int32
	Host string // at most 56 bytes
	Site string // at most 32 bytes
}

// Encode appends the 128-byte header to b. Longer names are truncated.
func (h *Header) Encode(b []byte) []byte {
	var p [HeaderSize]byte
	copy(p[0:8], Magic)
	binary.LittleEndian.PutUint16(p[8:], Version)
	binary.LittleEndian.PutUint16(p[10:], HeaderSize)
	binary.LittleEndian.PutUint16(p[12:], RecordSize)
	binary.LittleEndian.PutUint64(p[16:], uint64(h.Wall))
	binary.LittleEndian.PutUint64(p[24:], h.Mono)
	binary.LittleEndian.PutUint32(p[32:], h.PID)
	p[36] = h.SiteID
	if h.Rank >= 0 && h.Rank < MaxRank {
		r := uint32(h.Rank) + 1
		p[37], p[38], p[39] = byte(r), byte(r>>8), byte(r>>16)
	}
	copy(p[40:40+maxHost], h.Host)
	copy(p[96:96+maxSite], h.Site)
	return append(b, p[:]...)
}

// DecodeHeader parses the first HeaderSize bytes of b.
func DecodeHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < HeaderSize {
		return h, fmt.Errorf("%w: header of %d bytes", ErrFormat, len(b))
	}
	if string(b[0:8]) != Magic {
		return h, ErrMagic
	}
	if v := binary.LittleEndian.Uint16(b[8:]); v != Version {
		return h, fmt.Errorf("%w: version %d", ErrVersion, v)
	}
	if hs, rs := binary.LittleEndian.Uint16(b[10:]), binary.LittleEndian.Uint16(b[12:]); hs != HeaderSize || rs != RecordSize {
		return h, fmt.Errorf("%w: header size %d, record size %d (want %d, %d)", ErrFormat, hs, rs, HeaderSize, RecordSize)
	}
	h.Wall = int64(binary.LittleEndian.Uint64(b[16:]))
	h.Mono = binary.LittleEndian.Uint64(b[24:])
	h.PID = binary.LittleEndian.Uint32(b[32:])
	h.SiteID = b[36]
	h.Rank = int32(uint32(b[37])|uint32(b[38])<<8|uint32(b[39])<<16) - 1
	h.Host = cstr(b[40 : 40+maxHost])
	h.Site = cstr(b[96 : 96+maxSite])
	return h, nil
}

func cstr(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// WallTime converts a record's monotonic timestamp to wall-clock time.
func (h *Header) WallTime(mono uint64) time.Time {
	return time.Unix(0, h.Wall+int64(mono-h.Mono))
}

// Kind says what a record describes.
type Kind uint8

// Record kinds.
const (
	KindCall Kind = 1 // one intercepted call
	KindConn Kind = 2 // a connection's local and true peer endpoints
	KindLost Kind = 3 // Ret records were dropped (the ring was full)
	// KindSample is a TCP_INFO sample of the connection on FD, written by
	// the shim's Go side (shim/sample.go), Fn = 0. Added after the first
	// release of version 1: files without samples are unchanged.
	KindSample Kind = 4
)

// Func is the intercepted function.
type Func uint8

// Functions; the _chk variants of fortified builds count as the plain call.
const (
	FnRead Func = iota + 1
	FnWrite
	FnReadv
	FnWritev
	FnSend
	FnSendto
	FnSendmsg
	FnRecv
	FnRecvfrom
	FnRecvmsg
	FnConnect
	FnAccept
	FnAccept4
	FnClose
)

var fnNames = [...]string{"", "read", "write", "readv", "writev", "send", "sendto", "sendmsg",
	"recv", "recvfrom", "recvmsg", "connect", "accept", "accept4", "close"}

func (f Func) String() string {
	if int(f) < len(fnNames) && f != 0 {
		return fnNames[f]
	}
	return fmt.Sprintf("fn(%d)", uint8(f))
}

// Record flags.
const (
	FlagRelayed  = 0x01 // the connection was connected through the gateway
	FlagTruePeer = 0x02 // accepted from the gateway; Peer is the true source
)

// Record is one decoded record. Which fields are meaningful depends on Kind.
type Record struct {
	Mono  uint64        // CLOCK_MONOTONIC ns at the start of the call
	Dur   time.Duration // how long the call took (KindCall)
	TID   uint32
	FD    int32
	Kind  Kind
	Fn    Func
	Flags uint16
	Ret   int64  // return value (KindCall); records lost (KindLost)
	Req   uint64 // bytes asked for (KindCall)
	Errno int32  // errno when Ret < 0 (KindCall)
	Local netip.AddrPort
	Peer  netip.AddrPort // true peer (KindConn)
	Site  uint8          // site id of Peer when the gateway told it (KindConn)
	TCP   TCPSample      // KindSample
}

// SampleWhen says why a sample was taken.
type SampleWhen uint8

// Sample occasions.
const (
	SampleOpen     SampleWhen = 1 // right after connect/accept
	SamplePeriodic SampleWhen = 2 // by the shim's flusher, every MPI5K_TRACE_SAMPLE
	SampleClose    SampleWhen = 3 // right before close
)

func (w SampleWhen) String() string {
	switch w {
	case SampleOpen:
		return "open"
	case SamplePeriodic:
		return "periodic"
	case SampleClose:
		return "close"
	}
	return fmt.Sprintf("when(%d)", uint8(w))
}

// TCPSample is the part of TCP_INFO (and of what tcpinfo.Tracker derived
// from consecutive samples) that a KindSample record carries. The derived
// counters are cumulative over the connection, so the last sample of a
// connection has its totals.
type TCPSample struct {
	Cwnd         uint32        // segments
	Ssthresh     uint32        // segments (tcpinfo.InfiniteSsthresh before the first reduction)
	Unacked      uint32        // segments in flight
	MSS          uint32        // sender MSS, bytes
	RTT          time.Duration // smoothed RTT (µs on disk)
	TotalRetrans uint32        // kernel's tcpi_total_retrans
	RetransFast  uint32        // segments retransmitted without a timeout (Tracker)
	RetransRTO   uint32        // segments retransmitted in RTO recovery (Tracker)
	RTOs         uint16        // retransmission timeouts (Tracker), saturated
	IdleRestarts uint16        // restarts after idle (Tracker), saturated
	CAState      uint8
	When         SampleWhen
}

// InFlight is the bytes in flight the sample implies (segments x MSS).
func (s *TCPSample) InFlight() uint64 { return uint64(s.Unacked) * uint64(s.MSS) }

// CwndBytes is the congestion window in bytes (segments x MSS).
func (s *TCPSample) CwndBytes() uint64 { return uint64(s.Cwnd) * uint64(s.MSS) }

// sample layout, after the common 24 bytes.
func putSample(p []byte, s *TCPSample) {
	le := binary.LittleEndian
	le.PutUint32(p[24:], s.Cwnd)
	le.PutUint32(p[28:], s.Ssthresh)
	le.PutUint32(p[32:], s.Unacked)
	le.PutUint32(p[36:], s.MSS)
	us := s.RTT.Microseconds()
	if us > 0xffffffff {
		us = 0xffffffff
	}
	le.PutUint32(p[40:], uint32(us))
	le.PutUint32(p[44:], s.TotalRetrans)
	le.PutUint32(p[48:], s.RetransFast)
	le.PutUint32(p[52:], s.RetransRTO)
	le.PutUint16(p[56:], s.RTOs)
	le.PutUint16(p[58:], s.IdleRestarts)
	p[60] = s.CAState
	p[61] = byte(s.When)
}

func getSample(p []byte) TCPSample {
	le := binary.LittleEndian
	return TCPSample{
		Cwnd:         le.Uint32(p[24:]),
		Ssthresh:     le.Uint32(p[28:]),
		Unacked:      le.Uint32(p[32:]),
		MSS:          le.Uint32(p[36:]),
		RTT:          time.Duration(le.Uint32(p[40:])) * time.Microsecond,
		TotalRetrans: le.Uint32(p[44:]),
		RetransFast:  le.Uint32(p[48:]),
		RetransRTO:   le.Uint32(p[52:]),
		RTOs:         le.Uint16(p[56:]),
		IdleRestarts: le.Uint16(p[58:]),
		CAState:      p[60],
		When:         SampleWhen(p[61]),
	}
}

// Encode appends r as one 64-byte record to b (tests, tools; the shim's C
// layer writes the same bytes).
func (r *Record) Encode(b []byte) []byte {
	var p [RecordSize]byte
	binary.LittleEndian.PutUint64(p[0:], r.Mono)
	d := r.Dur.Nanoseconds()
	if d > 0xffffffff {
		d = 0xffffffff
	}
	binary.LittleEndian.PutUint32(p[8:], uint32(d))
	binary.LittleEndian.PutUint32(p[12:], r.TID)
	binary.LittleEndian.PutUint32(p[16:], uint32(r.FD))
	p[20] = byte(r.Kind)
	p[21] = byte(r.Fn)
	binary.LittleEndian.PutUint16(p[22:], r.Flags)
	switch r.Kind {
	case KindConn:
		putEP(p[24:44], r.Local, 0)
		putEP(p[44:64], r.Peer, r.Site)
	case KindSample:
		putSample(p[:], &r.TCP)
	default:
		binary.LittleEndian.PutUint64(p[24:], uint64(r.Ret))
		binary.LittleEndian.PutUint64(p[32:], r.Req)
		binary.LittleEndian.PutUint32(p[40:], uint32(r.Errno))
	}
	return append(b, p[:]...)
}

// endpoint: u8 family (4, 6, 0 = none), u8 site id, u16 port, 16 address bytes.
func putEP(b []byte, ap netip.AddrPort, site uint8) {
	a := ap.Addr().Unmap()
	b[1] = site
	binary.LittleEndian.PutUint16(b[2:], ap.Port())
	switch {
	case a.Is4():
		b[0] = 4
		v := a.As4()
		copy(b[4:], v[:])
	case a.Is6():
		b[0] = 6
		v := a.As16()
		copy(b[4:], v[:])
	}
}

func getEP(b []byte) (netip.AddrPort, uint8, error) {
	port := binary.LittleEndian.Uint16(b[2:])
	switch b[0] {
	case 0:
		return netip.AddrPort{}, b[1], nil
	case 4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port), b[1], nil
	case 6:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[4:20])), port), b[1], nil
	}
	return netip.AddrPort{}, 0, fmt.Errorf("%w: endpoint family %d", ErrFormat, b[0])
}

// DecodeRecord parses one 64-byte record.
func DecodeRecord(b []byte) (Record, error) {
	var r Record
	if len(b) < RecordSize {
		return r, fmt.Errorf("%w: record of %d bytes", ErrFormat, len(b))
	}
	r.Mono = binary.LittleEndian.Uint64(b[0:])
	r.Dur = time.Duration(binary.LittleEndian.Uint32(b[8:]))
	r.TID = binary.LittleEndian.Uint32(b[12:])
	r.FD = int32(binary.LittleEndian.Uint32(b[16:]))
	r.Kind = Kind(b[20])
	r.Fn = Func(b[21])
	r.Flags = binary.LittleEndian.Uint16(b[22:])
	switch r.Kind {
	case KindCall, KindLost:
		r.Ret = int64(binary.LittleEndian.Uint64(b[24:]))
		r.Req = binary.LittleEndian.Uint64(b[32:])
		r.Errno = int32(binary.LittleEndian.Uint32(b[40:]))
	case KindConn:
		var err error
		if r.Local, _, err = getEP(b[24:44]); err != nil {
			return r, err
		}
		if r.Peer, r.Site, err = getEP(b[44:64]); err != nil {
			return r, err
		}
	case KindSample:
		r.TCP = getSample(b)
		return r, nil
	default:
		return r, fmt.Errorf("%w: record kind %d", ErrFormat, b[20])
	}
	if r.Kind != KindLost && (r.Fn == 0 || int(r.Fn) >= len(fnNames)) {
		return r, fmt.Errorf("%w: function %d", ErrFormat, b[21])
	}
	return r, nil
}

// Reader decodes a trace file record by record.
type Reader struct {
	Header Header
	r      io.Reader
	buf    [RecordSize]byte
}

// NewReader reads and checks the header.
func NewReader(r io.Reader) (*Reader, error) {
	var hb [HeaderSize]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil, fmt.Errorf("%w: file shorter than its header", ErrFormat)
		}
		return nil, err
	}
	h, err := DecodeHeader(hb[:])
	if err != nil {
		return nil, err
	}
	return &Reader{Header: h, r: r}, nil
}

// Next returns the next record, io.EOF at a clean end. A truncated last
// record (the process died mid-write) is io.ErrUnexpectedEOF.
func (r *Reader) Next() (Record, error) {
	if _, err := io.ReadFull(r.r, r.buf[:]); err != nil {
		return Record{}, err
	}
	return DecodeRecord(r.buf[:])
}
