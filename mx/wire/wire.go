// Package wire is the one implementation of the MX-style LAN frame format
// (docs/mx-wire-format.md): a 48-byte header after the Ethernet header, in
// frames of EtherType 0x88B5, and the small bodies of CONNECT and REJECT.
//
// Decode works on the caller's buffer and never allocates or panics: it
// checks every bound before indexing and rejects a malformed frame with an
// error that wraps one of the exported sentinels and names the field at fault.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// EtherType is the IEEE 802 Local Experimental EtherType 1. It needs no
// registration and is meant for private protocols on one LAN, which is what
// this is: frames never leave a site's broadcast domain.
const EtherType = 0x88B5

// Version is the only header version this package speaks.
const Version = 1

// Size is the length of an encoded header; the payload follows it.
const Size = 48

// EthSize is the length of the Ethernet header before the MX header.
const EthSize = 14

// MinFrame and MaxFrame bound an MX frame (header and payload, Ethernet
// header excluded): at least the header, at most a 9000-byte jumbo frame.
const (
	MinFrame = Size
	MaxFrame = 9000
)

// MaxEager is the largest message an EAGER sequence may carry; larger
// messages go by rendezvous (RTS, PULL, DATA, DONE).
const MaxEager = 64 << 10

// Type is a frame type.
type Type uint8

// Frame types (docs/mx-wire-format.md).
const (
	TypeConnect    Type = 1  // open a channel between two endpoints
	TypeConnectAck Type = 2  // accept it
	TypeDisconnect Type = 3  // close it (sequenced: after every earlier frame)
	TypeEager      Type = 4  // one fragment of a small message
	TypeRTS        Type = 5  // rendezvous: a large message waits to be pulled
	TypePull       Type = 6  // rendezvous: the receiver asks for a byte range
	TypeData       Type = 7  // rendezvous: a fragment of a pulled range
	TypeDone       Type = 8  // rendezvous: the receiver holds every byte
	TypeAck        Type = 9  // cumulative and selective acknowledgement, window
	TypeNack       Type = 10 // an ACK sent at once because a gap appeared
	TypeReject     Type = 11 // no channel or endpoint for this frame
	maxType             = TypeReject
)

var typeNames = [...]string{
	TypeConnect: "CONNECT", TypeConnectAck: "CONNECT_ACK", TypeDisconnect: "DISCONNECT",
	TypeEager: "EAGER", TypeRTS: "RTS", TypePull: "PULL", TypeData: "DATA",
	TypeDone: "DONE", TypeAck: "ACK", TypeNack: "NACK", TypeReject: "REJECT",
}

func (t Type) String() string {
	if t >= 1 && t <= maxType {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Sequenced reports whether frames of type t carry a sequence number and are
// delivered reliably and in order on their channel.
func (t Type) Sequenced() bool {
	switch t {
	case TypeDisconnect, TypeEager, TypeRTS, TypePull, TypeData, TypeDone:
		return true
	}
	return false
}

// FlagAckNow asks the receiver to answer with an ACK at once (window probes,
// the last frame before a sender would wait).
const FlagAckNow uint8 = 1 << 0

const knownFlags = FlagAckNow

// Reject reasons (the one byte of a REJECT payload).
const (
	RejectNoEndpoint uint8 = 1 // the destination endpoint is not open
	RejectNoChannel  uint8 = 2 // no channel with this session: the peer restarted or closed it
	RejectFull       uint8 = 3 // the endpoint accepts no more channels
)

// Sentinel errors; Decode wraps them with the offending value.
var (
	ErrShort   = errors.New("mx frame shorter than its header")
	ErrVersion = errors.New("mx frame: unsupported version")
	ErrType    = errors.New("mx frame: unknown type")
	ErrFlags   = errors.New("mx frame: unknown flag")
	ErrField   = errors.New("mx frame: field not allowed for this type")
	ErrLength  = errors.New("mx frame: payload length does not match")
	ErrRange   = errors.New("mx frame: offset or length out of range")
)

// Header is a decoded MX header. Fields a type does not use are zero.
type Header struct {
	Type     Type
	Flags    uint8
	Dst, Src uint16 // endpoint ids
	Session  uint32 // the sender's session of this channel
	Seq      uint32 // sequenced types only
	Ack      uint32 // next sequence number the sender of this frame expects
	Sack     uint32 // bit i: frame Ack+1+i received
	Window   uint16 // frames beyond Ack the sender of this frame accepts
	Len      uint16 // payload bytes after the header
	Match    uint64 // EAGER and RTS
	Msg      uint32 // message id (EAGER, RTS) or rendezvous handle (PULL, DATA, DONE)
	MsgLen   uint32 // message length (EAGER, RTS, DATA) or bytes requested (PULL)
	Offset   uint32 // offset of this fragment or pulled range in the message
}

// Encode writes h into b[:Size]. It does not check h; Decode does.
func (h *Header) Encode(b []byte) {
	_ = b[Size-1]
	b[0] = Version
	b[1] = byte(h.Type)
	b[2] = h.Flags
	b[3] = 0
	binary.BigEndian.PutUint16(b[4:], h.Dst)
	binary.BigEndian.PutUint16(b[6:], h.Src)
	binary.BigEndian.PutUint32(b[8:], h.Session)
	binary.BigEndian.PutUint32(b[12:], h.Seq)
	binary.BigEndian.PutUint32(b[16:], h.Ack)
	binary.BigEndian.PutUint32(b[20:], h.Sack)
	binary.BigEndian.PutUint16(b[24:], h.Window)
	binary.BigEndian.PutUint16(b[26:], h.Len)
	binary.BigEndian.PutUint64(b[28:], h.Match)
	binary.BigEndian.PutUint32(b[36:], h.Msg)
	binary.BigEndian.PutUint32(b[40:], h.MsgLen)
	binary.BigEndian.PutUint32(b[44:], h.Offset)
}

// PutAck rewrites the acknowledgement fields of an encoded frame in place: a
// retransmitted frame carries the channel's current ACK, not the old one.
func PutAck(b []byte, ack, sack uint32, window uint16) {
	_ = b[Size-1]
	binary.BigEndian.PutUint32(b[16:], ack)
	binary.BigEndian.PutUint32(b[20:], sack)
	binary.BigEndian.PutUint16(b[24:], window)
}

// Decode parses and checks the header at the start of b, an MX frame without
// its Ethernet header. b may be longer than the frame (Ethernet pads short
// frames to 60 bytes); the payload is b[Size:Size+h.Len].
func Decode(b []byte) (Header, error) {
	var h Header
	if len(b) < Size {
		return h, fmt.Errorf("%w: %d bytes, need %d", ErrShort, len(b), Size)
	}
	if b[0] != Version {
		return h, fmt.Errorf("%w %d (this build speaks %d)", ErrVersion, b[0], Version)
	}
	h.Type = Type(b[1])
	if h.Type < 1 || h.Type > maxType {
		return h, fmt.Errorf("%w %d", ErrType, b[1])
	}
	h.Flags = b[2]
	if h.Flags&^knownFlags != 0 {
		return h, fmt.Errorf("%w %#x on %v", ErrFlags, h.Flags&^knownFlags, h.Type)
	}
	if b[3] != 0 {
		return h, fmt.Errorf("%w: reserved byte is %#x on %v, must be 0", ErrField, b[3], h.Type)
	}
	h.Dst = binary.BigEndian.Uint16(b[4:])
	h.Src = binary.BigEndian.Uint16(b[6:])
	h.Session = binary.BigEndian.Uint32(b[8:])
	h.Seq = binary.BigEndian.Uint32(b[12:])
	h.Ack = binary.BigEndian.Uint32(b[16:])
	h.Sack = binary.BigEndian.Uint32(b[20:])
	h.Window = binary.BigEndian.Uint16(b[24:])
	h.Len = binary.BigEndian.Uint16(b[26:])
	h.Match = binary.BigEndian.Uint64(b[28:])
	h.Msg = binary.BigEndian.Uint32(b[36:])
	h.MsgLen = binary.BigEndian.Uint32(b[40:])
	h.Offset = binary.BigEndian.Uint32(b[44:])
	if int(h.Len) > len(b)-Size {
		return h, fmt.Errorf("%w: %v declares %d payload bytes, %d present", ErrLength, h.Type, h.Len, len(b)-Size)
	}
	if int(h.Len) > MaxFrame-Size {
		return h, fmt.Errorf("%w: %v declares %d payload bytes, at most %d fit a frame", ErrLength, h.Type, h.Len, MaxFrame-Size)
	}
	return h, h.check()
}

// zero reports the first named field that is not zero.
func zero(t Type, fields ...any) error {
	for i := 0; i+1 < len(fields); i += 2 {
		var nz bool
		switch v := fields[i+1].(type) {
		case uint16:
			nz = v != 0
		case uint32:
			nz = v != 0
		case uint64:
			nz = v != 0
		}
		if nz {
			return fmt.Errorf("%w: %s is %v on %v, must be 0", ErrField, fields[i], fields[i+1], t)
		}
	}
	return nil
}

// check applies the per-type rules of docs/mx-wire-format.md.
func (h *Header) check() error {
	t := h.Type
	if !t.Sequenced() {
		if err := zero(t, "seq", h.Seq); err != nil {
			return err
		}
	}
	switch t {
	case TypeConnect, TypeConnectAck:
		if err := zero(t, "sack", h.Sack, "match", h.Match, "msg", h.Msg, "msglen", h.MsgLen, "offset", h.Offset); err != nil {
			return err
		}
		if h.Session == 0 {
			return fmt.Errorf("%w: session is 0 on %v, must be a nonzero nonce", ErrField, t)
		}
		if t == TypeConnect && h.Ack != 0 {
			return fmt.Errorf("%w: ack is %d on CONNECT, must be 0", ErrField, h.Ack)
		}
		if t == TypeConnectAck && h.Ack == 0 {
			return fmt.Errorf("%w: ack (the connector's session) is 0 on CONNECT_ACK", ErrField)
		}
		if h.Len != ConnectSize {
			return fmt.Errorf("%w: %v carries %d bytes, must carry %d", ErrLength, t, h.Len, ConnectSize)
		}
	case TypeDisconnect, TypeAck, TypeNack:
		if err := zero(t, "match", h.Match, "msg", h.Msg, "msglen", h.MsgLen, "offset", h.Offset, "len", h.Len); err != nil {
			return err
		}
	case TypeEager:
		if h.MsgLen > MaxEager {
			return fmt.Errorf("%w: EAGER message of %d bytes, at most %d (larger ones use RTS)", ErrRange, h.MsgLen, MaxEager)
		}
		if h.Len == 0 && h.MsgLen != 0 {
			return fmt.Errorf("%w: empty EAGER fragment of a %d-byte message", ErrLength, h.MsgLen)
		}
		if uint64(h.Offset)+uint64(h.Len) > uint64(h.MsgLen) {
			return fmt.Errorf("%w: EAGER fragment %d+%d past message length %d", ErrRange, h.Offset, h.Len, h.MsgLen)
		}
	case TypeRTS:
		if err := zero(t, "offset", h.Offset, "len", h.Len); err != nil {
			return err
		}
		if h.MsgLen == 0 {
			return fmt.Errorf("%w: RTS for an empty message (send it EAGER)", ErrRange)
		}
	case TypePull:
		if err := zero(t, "match", h.Match, "len", h.Len); err != nil {
			return err
		}
		if h.MsgLen == 0 {
			return fmt.Errorf("%w: PULL of 0 bytes", ErrRange)
		}
		if uint64(h.Offset)+uint64(h.MsgLen) > 1<<32 {
			return fmt.Errorf("%w: PULL %d+%d past 4 GiB", ErrRange, h.Offset, h.MsgLen)
		}
	case TypeData:
		if err := zero(t, "match", h.Match); err != nil {
			return err
		}
		if h.Len == 0 {
			return fmt.Errorf("%w: empty DATA fragment", ErrLength)
		}
		if uint64(h.Offset)+uint64(h.Len) > uint64(h.MsgLen) {
			return fmt.Errorf("%w: DATA fragment %d+%d past message length %d", ErrRange, h.Offset, h.Len, h.MsgLen)
		}
	case TypeDone:
		if err := zero(t, "match", h.Match, "msglen", h.MsgLen, "offset", h.Offset, "len", h.Len); err != nil {
			return err
		}
	case TypeReject:
		if err := zero(t, "ack", h.Ack, "sack", h.Sack, "window", h.Window, "match", h.Match, "msg", h.Msg, "msglen", h.MsgLen, "offset", h.Offset); err != nil {
			return err
		}
		if h.Len != 1 {
			return fmt.Errorf("%w: REJECT carries %d bytes, must carry 1 (the reason)", ErrLength, h.Len)
		}
	}
	return nil
}

// ConnectSize is the length of the CONNECT and CONNECT_ACK body.
const ConnectSize = 4

// Connect is the body of CONNECT and CONNECT_ACK: the largest frame (header
// and payload) the sender accepts, so the two ends use the smaller MTU.
type Connect struct {
	MaxFrame uint16
}

// AppendConnect appends the encoded body.
func AppendConnect(b []byte, c Connect) []byte {
	return append(b, byte(c.MaxFrame>>8), byte(c.MaxFrame), 0, 0)
}

// ParseConnect decodes and checks a CONNECT or CONNECT_ACK body.
func ParseConnect(p []byte) (Connect, error) {
	if len(p) != ConnectSize {
		return Connect{}, fmt.Errorf("%w: connect body of %d bytes, must be %d", ErrLength, len(p), ConnectSize)
	}
	c := Connect{MaxFrame: binary.BigEndian.Uint16(p)}
	if c.MaxFrame < MinFrame+1 || int(c.MaxFrame) > MaxFrame {
		return c, fmt.Errorf("%w: max frame %d, must be %d..%d", ErrRange, c.MaxFrame, MinFrame+1, MaxFrame)
	}
	if p[2] != 0 || p[3] != 0 {
		return c, fmt.Errorf("%w: reserved connect bytes %#x %#x, must be 0", ErrField, p[2], p[3])
	}
	return c, nil
}

// ParseReject decodes a REJECT body: its reason.
func ParseReject(p []byte) (uint8, error) {
	if len(p) != 1 {
		return 0, fmt.Errorf("%w: reject body of %d bytes, must be 1", ErrLength, len(p))
	}
	if p[0] < RejectNoEndpoint || p[0] > RejectFull {
		return p[0], fmt.Errorf("%w: reject reason %d", ErrRange, p[0])
	}
	return p[0], nil
}

// SeqLess reports a < b in sequence space (serial number arithmetic, RFC
// 1982): sequence numbers wrap at 2^32.
func SeqLess(a, b uint32) bool { return int32(a-b) < 0 }
