package node

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/gateway"
	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/mx"
)

// FuzzResumeDaemon plays the far site's node daemon: the bytes of a
// resumable stream a gateway opens to this daemon, arbitrary, then a
// RESET. The daemon must not panic; the rank's connection must get only
// the bytes of the well-formed DATA records up to the first malformed
// record, in order, and must end; the daemon must then hold no session.
// (header's FuzzResumeRecords fuzzes the records' codec alone.)
func FuzzResumeDaemon(f *testing.F) {
	hello := func(flags byte, rcv, acked uint64) []byte { return header.AppendResumeHello(nil, flags, rcv, acked) }
	data := func(b []byte) []byte { return header.AppendResumeData(nil, b) }
	ack := func(n uint64) []byte { return header.AppendResumeAck(nil, n) }
	const recData, recFin, recReset = byte(header.ResumeData), byte(header.ResumeFin), byte(header.ResumeReset)
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	f.Add(hello(0, 0, 0))
	f.Add(cat(hello(0, 0, 0), data([]byte("hello, rank")), data([]byte("again"))))
	f.Add(cat(hello(0, 0, 0), data([]byte("bye")), []byte{recFin}))
	f.Add(cat(hello(0, 0, 0), data([]byte("x")), ack(0), []byte{recFin}, data([]byte("after the end"))))
	f.Add(cat(hello(0, 0, 0), ack(1)))                             // acknowledges more than was sent
	f.Add(cat(hello(0, 1, 0), data([]byte("x"))))                  // claims the FIN of nothing sent
	f.Add(cat(hello(0, 5, 0)))                                     // claims bytes never sent
	f.Add(cat(hello(0, 0, 1)))                                     // acknowledges more than it received
	f.Add(cat(hello(header.ResumeKnown, 0, 0), data([]byte("x")))) // resumes what this daemon never held
	f.Add(cat(hello(0, 0, 0), []byte{recData, 0, 0, 0, 0}))
	f.Add(cat(hello(0, 0, 0), []byte{recData, 0, 1, 0, 1})) // longer than a record may be
	f.Add(cat(hello(0, 0, 0), []byte{recData, 0, 0, 0, 9}, []byte("short")))
	f.Add(cat(hello(0, 0, 0), data(bytes.Repeat([]byte{7}, header.MaxResumeData))))
	f.Add(cat(hello(0, 0, 0), []byte{9}))
	f.Add([]byte{recReset})
	f.Add([]byte{recData})
	f.Add(hello(0, 0, 0)[:7])

	d, tr := lanCfg(f, func(c *Config) {
		c.Hold, c.FirstFrame, c.DialTimeout = 5*time.Millisecond, 500*time.Millisecond, time.Second
	})
	f.Fuzz(func(t *testing.T, in []byte) {
		rl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer rl.Close()
		sent := append(append([]byte(nil), in...), byte(header.ResumeReset))
		want := wellFormedData(sent)
		var got []byte
		rankDone := make(chan error, 1)
		go func() {
			c, err := rl.Accept()
			if err != nil {
				rankDone <- nil // never dialed
				return
			}
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, err = io.ReadAll(c)
			rankDone <- err
		}()
		var id header.ResumeID
		rand.Read(id[:])
		id[0] |= 1
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := tr.Dial(ctx, gwLAN.Addr(), addrPort(rl.Addr()), id, nil)
		if err != nil {
			t.Fatal(err)
		}
		streamDone := make(chan struct{})
		go func() { io.Copy(io.Discard, s); close(streamDone) }()
		s.Write(sent)
		s.CloseWrite()
		// The daemon ends the stream: at the RESET, a malformed record,
		// or a HELLO it refuses.
		select {
		case <-streamDone:
		case <-time.After(10 * time.Second):
			t.Fatal("the daemon does not end a stream that ended with RESET")
		}
		for i := 0; ; i++ {
			d.sessMu.Lock()
			n := len(d.sessions)
			d.sessMu.Unlock()
			if n == 0 {
				break
			}
			if i == 5000 {
				t.Fatalf("the daemon still holds %d sessions", n)
			}
			time.Sleep(time.Millisecond)
		}
		rl.Close()
		select {
		case err := <-rankDone:
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the rank's connection outlives its session")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the rank's connection outlives its session")
		}
		if !bytes.HasPrefix(want, got) {
			t.Fatalf("rank got %d bytes (%.40q), not a prefix of the %d of DATA sent (%.40q)", len(got), got, len(want), want)
		}
		s.Abort()
	})
}

// wellFormedData is what a daemon may deliver to the rank of in: the
// bodies of the DATA records after a HELLO a new connection accepts, up
// to the first record that is not well formed (the wire format's, not
// the code's, reading).
func wellFormedData(in []byte) []byte {
	const helloLen, dataHdr = header.ResumeHelloSize, header.ResumeDataPrefix
	if len(in) < helloLen || in[0] != byte(header.ResumeHello) || in[1]&header.ResumeKnown != 0 {
		return nil
	}
	rcv, acked := binary.BigEndian.Uint64(in[2:]), binary.BigEndian.Uint64(in[10:])
	if rcv > 1 || acked > rcv {
		return nil
	}
	var out []byte
	for b := in[helloLen:]; len(b) > 0; {
		switch header.ResumeType(b[0]) {
		case header.ResumeData:
			if len(b) < dataHdr {
				return out
			}
			n := int(binary.BigEndian.Uint32(b[1:]))
			if n == 0 || n > header.MaxResumeData || len(b) < dataHdr+n {
				return out
			}
			out = append(out, b[dataHdr:dataHdr+n]...)
			b = b[dataHdr+n:]
		case header.ResumeAck:
			if len(b) < 9 {
				return out
			}
			b = b[9:]
		case header.ResumeFin:
			b = b[1:]
		default:
			return out
		}
	}
	return out
}

// lanCfg is lan with resumable streams and cfg adjusted by tweak, for
// any testing.TB.
func lanCfg(t testing.TB, tweak func(*Config)) (*Daemon, *gateway.MXTransport) {
	hub := mx.NewMemHub(1500)
	var eps []*mx.Endpoint
	for _, mac := range []mx.MAC{{2, 0, 0, 0, 9, 1}, {2, 0, 0, 0, 9, 2}} {
		eps = append(eps, endpoint(t, hub.Attach(mac), mx.Config{Buffers: 1024}))
	}
	cfg := Config{Addr: nodeAddr, Listen: netip.MustParseAddrPort("127.0.0.2:0"),
		Gateways: []Gateway{{LAN: gwLAN, MX: eps[0].Addr()}}, EP: eps[1], MaxConns: 64}
	tweak(&cfg)
	d := startDaemon(t, cfg)
	tr := &gateway.MXTransport{EP: eps[0], Resolve: func(netip.Addr) (mx.Addr, error) { return eps[1].Addr(), nil }}
	return d, tr
}
