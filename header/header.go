// Package header is the one implementation of the mpi5k wire format
// (docs/wire-format.md): the 12-byte frame header shared by the WAN link,
// the LAN open and the LAN peer query, the bodies of the control frames,
// and the resume records the node daemons frame a resumable stream's bytes
// in (resume.go).
//
// Everything on the data path (Header.Encode, Decode, the u32 bodies and the
// Reader) works on caller buffers and never allocates, so a gateway can move
// millions of frames a second without feeding the garbage collector. Every
// decoder checks bounds before it indexes and rejects malformed input with one
// of the exported sentinel errors (test with errors.Is).
package header

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is the only frame version this package speaks.
const Version = 1

// Size is the length of an encoded frame header.
const Size = 12

// MaxPayload is the largest payload any frame may carry (1 MiB).
const MaxPayload = 1 << 20

// MaxControl is the largest payload of a control frame (every type but
// DATA). Control bodies are tens of bytes; the small cap keeps a hostile peer
// from making a gateway buffer a megabyte per control frame.
const MaxControl = 4096

// Type is a frame type.
type Type uint8

// Frame types (docs/wire-format.md).
const (
	TypeHello       Type = 1
	TypeOpen        Type = 2
	TypeOpenOK      Type = 3
	TypeOpenRefused Type = 4
	TypeData        Type = 5
	TypeHalfClose   Type = 6
	TypeReset       Type = 7
	TypeWindow      Type = 8
	TypePing        Type = 9
	TypePong        Type = 10
	TypePeerQuery   Type = 11
	TypePeerReply   Type = 12
	TypeDataAt      Type = 13 // DATA with its stream offset, for trunked links
	TypeClamp       Type = 14 // cap on the receive window of the link's socket
	TypeRetire      Type = 15 // the sender writes nothing more on this link
	TypeRenew       Type = 16 // acceptor to dialer: replace this (express) link
	TypeAck         Type = 17 // bytes of the link received so far (WAN resume)
	TypePad         Type = 18 // filler the receiver discards
	TypeListen      Type = 19 // LAN: a rank listens on this port of its host
	TypeListenReply Type = 20 // LAN: the gateway's answer to LISTEN
	// TypeOpenReply (LAN): the gateway's answer to an OPEN with a resume
	// id, one byte: 1 if the stream goes on resumable, 0 if plain.
	TypeOpenReply Type = 21
)

// typeInfo is what the header of a frame type must satisfy, checked by
// Decode before any payload is read.
type typeInfo struct {
	name     string
	min, max uint32     // payload bytes
	stream   streamRule // the stream ids the type may carry
}

type streamRule uint8

const (
	anyStream  streamRule = iota // a LAN request id, or OPEN (0 on the LAN, the stream's id on the WAN)
	linkOnly                     // 0: the frame is about the link
	streamOnly                   // not 0: the frame is about a stream
)

// types is every frame type's entry: a new type needs its constant above
// and a line here, then its body's codec and the code that sends and
// takes it.
var types = [...]typeInfo{
	TypeHello:       {"HELLO", helloFixed, MaxControl, linkOnly},
	TypeOpen:        {"OPEN", 2 * minEndpoint, MaxControl, anyStream},
	TypeOpenOK:      {"OPEN_OK", 0, 0, streamOnly},
	TypeOpenRefused: {"OPEN_REFUSED", 4, 4, streamOnly},
	TypeData:        {"DATA", 1, MaxPayload, streamOnly},
	TypeHalfClose:   {"HALF_CLOSE", 0, 4, streamOnly}, // empty, or the final stream offset (never 1..3, checked in Decode)
	TypeReset:       {"RESET", 4, 4, streamOnly},
	TypeWindow:      {"WINDOW", 4, 4, streamOnly},
	TypePing:        {"PING", 8, 8, linkOnly},
	TypePong:        {"PONG", 8, 8, linkOnly},
	TypePeerQuery:   {"PEER_QUERY", 2 * minEndpoint, 2 * maxEndpoint, anyStream},
	TypePeerReply:   {"PEER_REPLY", 2 + minEndpoint, 2 + maxEndpoint, anyStream},
	TypeDataAt:      {"DATA_AT", 5, MaxPayload, streamOnly},
	TypeClamp:       {"CLAMP", 4, 4, linkOnly},
	TypeRetire:      {"RETIRE", 0, 0, linkOnly},
	TypeRenew:       {"RENEW", 0, 0, linkOnly},
	TypeAck:         {"ACK", 8, 8, linkOnly},
	TypePad:         {"PAD", 0, MaxPayload, linkOnly},
	TypeListen:      {"LISTEN", 2, 2, anyStream},
	TypeListenReply: {"LISTEN_REPLY", 1, 1, anyStream},
	TypeOpenReply:   {"OPEN_REPLY", 1, 1, linkOnly},
}

// known tells whether t is a type of this version.
func (t Type) known() bool { return int(t) < len(types) && types[t].name != "" }

func (t Type) String() string {
	if t.known() {
		return types[t].name
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// FlagSeq is reserved for WAN resume (version 2); version 1 rejects it like
// any other flag.
const FlagSeq uint16 = 1 << 15

// Sentinel errors. Decoders wrap them with detail; compare with errors.Is.
var (
	ErrVersion  = errors.New("header: unsupported frame version")
	ErrType     = errors.New("header: unknown frame type")
	ErrFlags    = errors.New("header: undefined frame flags set")
	ErrTooLarge = errors.New("header: frame payload too large")
	ErrPayload  = errors.New("header: malformed frame payload")
	ErrCritical = errors.New("header: unknown critical extension")
	ErrShort    = errors.New("header: buffer too short")
	ErrStream   = errors.New("header: stream id not allowed for frame type")
)

// Header is a decoded frame header.
type Header struct {
	Type   Type
	Flags  uint16
	Stream uint32
	Length uint32 // payload bytes following the header
}

// Encode writes h into b[:Size]. It panics if len(b) < Size, like
// binary.BigEndian.PutUint32: a short buffer is a programming error.
func (h Header) Encode(b []byte) {
	_ = b[Size-1] // one bounds check for the whole header
	b[0] = Version
	b[1] = byte(h.Type)
	binary.BigEndian.PutUint16(b[2:4], h.Flags)
	binary.BigEndian.PutUint32(b[4:8], h.Stream)
	binary.BigEndian.PutUint32(b[8:12], h.Length)
}

// Decode parses and validates the header in b[:Size]: version, type, flags,
// the payload length allowed for the type (ErrTooLarge above MaxPayload or
// MaxControl, ErrPayload for a size the type cannot have) and the stream id
// (ErrStream: link frames use 0, stream frames other than OPEN a non-zero id).
// It never allocates unless it returns an error.
func Decode(b []byte) (Header, error) {
	if len(b) < Size {
		return Header{}, fmt.Errorf("%w: header needs %d bytes, have %d", ErrShort, Size, len(b))
	}
	h := Header{
		Type:   Type(b[1]),
		Flags:  binary.BigEndian.Uint16(b[2:4]),
		Stream: binary.BigEndian.Uint32(b[4:8]),
		Length: binary.BigEndian.Uint32(b[8:12]),
	}
	if b[0] != Version {
		return h, fmt.Errorf("%w: %d (want %d)", ErrVersion, b[0], Version)
	}
	if !h.Type.known() {
		return h, fmt.Errorf("%w: %d", ErrType, uint8(h.Type))
	}
	if h.Flags != 0 {
		return h, fmt.Errorf("%w: %#04x on %v", ErrFlags, h.Flags, h.Type)
	}
	ti := &types[h.Type]
	lo, hi := ti.min, ti.max
	if h.Length > hi {
		if h.Length > MaxPayload || hi == MaxControl {
			return h, fmt.Errorf("%w: %v of %d bytes (limit %d)", ErrTooLarge, h.Type, h.Length, hi)
		}
		return h, fmt.Errorf("%w: %v of %d bytes (want %d..%d)", ErrPayload, h.Type, h.Length, lo, hi)
	}
	if h.Length < lo || h.Type == TypeHalfClose && h.Length != 0 && h.Length != 4 {
		return h, fmt.Errorf("%w: %v of %d bytes (want %d..%d)", ErrPayload, h.Type, h.Length, lo, hi)
	}
	switch {
	case ti.stream == linkOnly && h.Stream != 0:
		return h, fmt.Errorf("%w: %v on stream %d (want 0)", ErrStream, h.Type, h.Stream)
	case ti.stream == streamOnly && h.Stream == 0:
		return h, fmt.Errorf("%w: %v on stream 0", ErrStream, h.Type)
	}
	return h, nil
}

// Code is the reason carried by OPEN_REFUSED and RESET.
type Code uint32

// Reset and refusal codes (docs/wire-format.md).
const (
	CodeRefused     Code = 1
	CodeUnreachable Code = 2
	CodeTimedOut    Code = 3
	CodePolicy      Code = 4
	CodeUnknownDest Code = 5
	CodeShutdown    Code = 6
	CodeLinkLost    Code = 7
	CodeProtocol    Code = 8
	CodeAppReset    Code = 9
	CodeLimit       Code = 10 // a gateway limit (docs/limits.md)
)

var codeNames = [...]string{
	CodeRefused: "refused", CodeUnreachable: "unreachable", CodeTimedOut: "timed out",
	CodePolicy: "not permitted by policy", CodeUnknownDest: "unknown destination",
	CodeShutdown: "gateway shutting down", CodeLinkLost: "link lost",
	CodeProtocol: "protocol error", CodeAppReset: "reset by the application",
	CodeLimit: "gateway limit reached",
}

func (c Code) String() string {
	if c >= 1 && c <= CodeLimit {
		return codeNames[c]
	}
	return fmt.Sprintf("code %d", uint32(c))
}

// PutU32 writes the 4-byte body of OPEN_REFUSED, RESET, WINDOW or CLAMP into b.
func PutU32(b []byte, v uint32) { binary.BigEndian.PutUint32(b, v) }

// DecodeCode parses the body of OPEN_REFUSED or RESET. Unknown codes are
// accepted (a newer peer may define more); only the size is checked.
func DecodeCode(p []byte) (Code, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("%w: code body of %d bytes (want 4)", ErrPayload, len(p))
	}
	return Code(binary.BigEndian.Uint32(p)), nil
}

// DataAtPrefix is the size of DATA_AT's offset field, before the payload.
const DataAtPrefix = 4

// DecodeOffset parses a stream offset: the first 4 bytes of DATA_AT, or
// the body of a HALF_CLOSE that carries one.
func DecodeOffset(p []byte) (uint32, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("%w: offset of %d bytes (want 4)", ErrPayload, len(p))
	}
	return binary.BigEndian.Uint32(p), nil
}

// DecodeWindow parses the body of WINDOW; a zero increment is malformed.
func DecodeWindow(p []byte) (uint32, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("%w: WINDOW body of %d bytes (want 4)", ErrPayload, len(p))
	}
	v := binary.BigEndian.Uint32(p)
	if v == 0 {
		return 0, fmt.Errorf("%w: WINDOW increment 0", ErrPayload)
	}
	return v, nil
}

// DecodeClamp parses the body of CLAMP: the largest receive window, in
// bytes, the link's receiver should advertise; 0 lifts the cap.
func DecodeClamp(p []byte) (uint32, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("%w: CLAMP body of %d bytes (want 4)", ErrPayload, len(p))
	}
	return binary.BigEndian.Uint32(p), nil
}

// DecodeAck parses the body of ACK: how many bytes of the link (frames
// whole, headers included) the sender has received since the link began.
func DecodeAck(p []byte) (uint64, error) {
	if len(p) != 8 {
		return 0, fmt.Errorf("%w: ACK body of %d bytes (want 8)", ErrPayload, len(p))
	}
	return binary.BigEndian.Uint64(p), nil
}

// PutU64 writes v big-endian into b[:8] (an ACK body).
func PutU64(b []byte, v uint64) { binary.BigEndian.PutUint64(b, v) }

// AppendFrame appends a header for (t, stream) and payload to b. It is a
// convenience for control frames and tests; the relay encodes headers into
// preallocated buffers instead.
func AppendFrame(b []byte, t Type, stream uint32, payload []byte) []byte {
	var h [Size]byte
	Header{Type: t, Stream: stream, Length: uint32(len(payload))}.Encode(h[:])
	b = append(b, h[:]...)
	return append(b, payload...)
}
