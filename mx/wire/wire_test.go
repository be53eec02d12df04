package wire

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func frame(h Header, payload []byte) []byte {
	h.Len = uint16(len(payload))
	b := make([]byte, Size, Size+len(payload))
	h.Encode(b)
	return append(b, payload...)
}

func TestRoundTrip(t *testing.T) {
	cases := []struct {
		h Header
		p []byte
	}{
		{Header{Type: TypeConnect, Dst: 1, Src: 2, Session: 7, Window: 64}, AppendConnect(nil, Connect{MaxFrame: 1500})},
		{Header{Type: TypeConnectAck, Dst: 2, Src: 1, Session: 9, Ack: 7, Window: 64}, AppendConnect(nil, Connect{MaxFrame: 1500})},
		{Header{Type: TypeEager, Flags: FlagAckNow, Dst: 3, Src: 4, Session: 1, Seq: 1 << 31, Ack: 5, Sack: 0xf0, Window: 9,
			Match: 0xdeadbeefcafe, Msg: 3, MsgLen: 3000, Offset: 1452}, bytes.Repeat([]byte{1}, 1452)},
		{Header{Type: TypeEager, Session: 1, Seq: 2}, nil},
		{Header{Type: TypeRTS, Session: 1, Seq: 3, Match: ^uint64(0), Msg: 4, MsgLen: 1 << 30}, nil},
		{Header{Type: TypePull, Session: 1, Seq: 4, Msg: 4, MsgLen: 65536, Offset: 65536}, nil},
		{Header{Type: TypeData, Session: 1, Seq: 5, Msg: 4, MsgLen: 1 << 20, Offset: 100}, []byte("abc")},
		{Header{Type: TypeDone, Session: 1, Seq: 6, Msg: 4}, nil},
		{Header{Type: TypeAck, Session: 1, Ack: 6, Sack: 1, Window: 100}, nil},
		{Header{Type: TypeNack, Session: 1, Ack: 6, Sack: 2}, nil},
		{Header{Type: TypeDisconnect, Session: 1, Seq: 7}, nil},
		{Header{Type: TypeReject, Dst: 1, Src: 9}, []byte{RejectNoChannel}},
	}
	for _, c := range cases {
		b := frame(c.h, c.p)
		got, err := Decode(append(b, 0, 0)) // Ethernet padding after the frame
		if err != nil {
			t.Fatalf("%v: %v", c.h.Type, err)
		}
		want := c.h
		want.Len = uint16(len(c.p))
		if got != want {
			t.Fatalf("%v: decoded %+v, want %+v", c.h.Type, got, want)
		}
	}
}

func TestRejects(t *testing.T) {
	good := frame(Header{Type: TypeEager, Session: 1, Seq: 1, MsgLen: 3}, []byte("abc"))
	mut := func(f func(b []byte)) []byte {
		b := bytes.Clone(good)
		f(b)
		return b
	}
	cases := []struct {
		name string
		b    []byte
		err  error
		say  string
	}{
		{"short", good[:47], ErrShort, "47 bytes"},
		{"version", mut(func(b []byte) { b[0] = 2 }), ErrVersion, "version 2"},
		{"type0", mut(func(b []byte) { b[1] = 0 }), ErrType, "type 0"},
		{"type99", mut(func(b []byte) { b[1] = 99 }), ErrType, "99"},
		{"flags", mut(func(b []byte) { b[2] = 0x80 }), ErrFlags, "0x80"},
		{"reserved", mut(func(b []byte) { b[3] = 1 }), ErrField, "reserved"},
		{"truncated payload", good[:Size+2], ErrLength, "3 payload bytes, 2 present"},
		{"past message", frame(Header{Type: TypeEager, MsgLen: 2}, []byte("abc")), ErrRange, "past message length"},
		{"eager too big", frame(Header{Type: TypeEager, MsgLen: MaxEager + 1}, []byte("a")), ErrRange, "RTS"},
		{"empty fragment", frame(Header{Type: TypeEager, MsgLen: 5}, nil), ErrLength, "empty EAGER"},
		{"ack with seq", frame(Header{Type: TypeAck, Seq: 3}, nil), ErrField, "seq"},
		{"ack with payload", frame(Header{Type: TypeAck}, []byte("x")), ErrField, "len"},
		{"rts empty", frame(Header{Type: TypeRTS}, nil), ErrRange, "empty message"},
		{"pull 0", frame(Header{Type: TypePull, Msg: 1}, nil), ErrRange, "0 bytes"},
		{"pull wraps", frame(Header{Type: TypePull, Msg: 1, Offset: 1 << 31, MsgLen: 1<<31 + 1}, nil), ErrRange, "4 GiB"},
		{"data empty", frame(Header{Type: TypeData, MsgLen: 5}, nil), ErrLength, "empty DATA"},
		{"data with match", frame(Header{Type: TypeData, Match: 1, MsgLen: 5}, []byte("a")), ErrField, "match"},
		{"connect no session", frame(Header{Type: TypeConnect}, AppendConnect(nil, Connect{MaxFrame: 1500})), ErrField, "nonzero nonce"},
		{"connect ack no ack", frame(Header{Type: TypeConnectAck, Session: 1}, AppendConnect(nil, Connect{MaxFrame: 1500})), ErrField, "connector's session"},
		{"connect body", frame(Header{Type: TypeConnect, Session: 1}, []byte{1}), ErrLength, "must carry 4"},
		{"reject body", frame(Header{Type: TypeReject}, nil), ErrLength, "reason"},
		{"done with msglen", frame(Header{Type: TypeDone, MsgLen: 1}, nil), ErrField, "msglen"},
	}
	for _, c := range cases {
		_, err := Decode(c.b)
		if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.say) {
			t.Errorf("%s: got %v, want %v saying %q", c.name, err, c.err, c.say)
		}
	}
}

func TestBodies(t *testing.T) {
	c, err := ParseConnect(AppendConnect(nil, Connect{MaxFrame: 9000}))
	if err != nil || c.MaxFrame != 9000 {
		t.Fatalf("connect: %+v %v", c, err)
	}
	for _, p := range [][]byte{nil, {0x05, 0xdc, 0, 1}, AppendConnect(nil, Connect{MaxFrame: 48}), AppendConnect(nil, Connect{MaxFrame: 9001})} {
		if _, err := ParseConnect(p); err == nil {
			t.Errorf("connect body %x accepted", p)
		}
	}
	if r, err := ParseReject([]byte{RejectFull}); err != nil || r != RejectFull {
		t.Fatalf("reject: %d %v", r, err)
	}
	for _, p := range [][]byte{nil, {0}, {4}, {1, 1}} {
		if _, err := ParseReject(p); err == nil {
			t.Errorf("reject body %x accepted", p)
		}
	}
}

func TestSeqLess(t *testing.T) {
	if !SeqLess(1, 2) || SeqLess(2, 1) || SeqLess(5, 5) || !SeqLess(0xffffffff, 0) || SeqLess(0, 0xffffffff) {
		t.Fatal("serial arithmetic broken")
	}
}

// FuzzDecode: Decode never panics; what it accepts re-encodes to the same
// header bytes and declares a payload that is present; the body parsers
// never panic.
func FuzzDecode(f *testing.F) {
	f.Add(frame(Header{Type: TypeEager, Session: 1, Seq: 1, MsgLen: 3}, []byte("abc")))
	f.Add(frame(Header{Type: TypeConnect, Session: 1, Window: 8}, AppendConnect(nil, Connect{MaxFrame: 1500})))
	f.Add(frame(Header{Type: TypeRTS, Session: 1, Seq: 2, Match: 5, Msg: 1, MsgLen: 1 << 20}, nil))
	f.Add(frame(Header{Type: TypePull, Session: 1, Seq: 2, Msg: 1, MsgLen: 1 << 16}, nil))
	f.Add(frame(Header{Type: TypeData, Session: 1, Seq: 2, Msg: 1, MsgLen: 1 << 16, Offset: 9}, []byte("x")))
	f.Add(frame(Header{Type: TypeAck, Session: 1, Ack: 9, Sack: 5, Window: 3}, nil))
	f.Add(frame(Header{Type: TypeReject}, []byte{1}))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Decode(b)
		if err == nil {
			out := make([]byte, Size)
			h.Encode(out)
			if !bytes.Equal(out, b[:Size]) {
				t.Fatalf("%+v re-encodes differently", h)
			}
			if Size+int(h.Len) > len(b) {
				t.Fatalf("accepted %d payload bytes of %d", h.Len, len(b)-Size)
			}
			if h.Type == TypeEager || h.Type == TypeData {
				if uint64(h.Offset)+uint64(h.Len) > uint64(h.MsgLen) {
					t.Fatalf("accepted fragment past its message: %+v", h)
				}
			}
		}
		p := b
		if len(b) > Size {
			p = b[Size:]
		}
		ParseConnect(p)
		ParseReject(p)
	})
}
