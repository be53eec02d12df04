package testbed

import (
	"bytes"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"
)

// tcpPacket is an IPv4 TCP segment sport -> dport with payload bytes of
// random data and a correct checksum.
func tcpPacket(t *testing.T, sport, dport uint16, payload int, r *rand.Rand) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, Flags: layers.IPv4DontFragment,
		SrcIP: []byte{10, 77, 1, 2}, DstIP: []byte{10, 77, 2, 2}}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Seq: r.Uint32(), ACK: true, PSH: true, Window: 500}
	if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, payload)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, tcp, gopacket.Payload(data)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestTamper: a link with Tamper{Port 5001, Every 3, Count 2} alters
// exactly the 3rd and 6th data segments of port 5001's flows, by one bit
// each in the payload, with a checksum the kernel accepts; segments of
// other ports, short ones and those after the count pass unchanged.
func TestTamper(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	in, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = unix.Shutdown(in[1], unix.SHUT_RDWR)
		unix.Close(in[0])
		unix.Close(out[1])
	}()
	p := &emuParams{queue: 1 << 20}
	l, err := newLink("site1", "site2", in[1], out[0], p, 1500, newClock(), 3)
	if err != nil {
		t.Fatal(err)
	}
	links := []*link{l, {from: "site2", to: "site1"}}
	for _, c := range []struct {
		t    Tamper
		want string
	}{
		{Tamper{Every: 1}, "port 0"},
		{Tamper{A: "site1", Port: 5001, Every: 1}, "both sites"},
		{Tamper{A: "site1", B: "site9", Port: 5001, Every: 1}, `no link between sites "site1" and "site9"`},
		{Tamper{Port: 5001, Every: 3, Count: 2}, ""},
	} {
		if got := applyTamper(links, &c.t); c.want == "" && got != "" || !strings.Contains(got, c.want) {
			t.Errorf("applyTamper(%+v) = %q, want %q", c.t, got, c.want)
		}
	}
	go l.reader()
	go l.writer(l.main)
	_ = unix.SetsockoptTimeval(out[1], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})

	r := rand.New(rand.NewPCG(1, 2))
	type seg struct {
		sport, dport uint16
		payload      int
		flip         bool
	}
	segs := []seg{
		{40000, 5001, 1400, false}, // data 1
		{5001, 40000, 0, false},    // a pure ACK
		{40000, 5001, 100, false},  // short: not data
		{40000, 7001, 1400, false}, // another port
		{5001, 40000, 1400, false}, // data 2 (either direction of the flow)
		{40000, 5001, 600, true},   // data 3
		{40000, 5001, 1400, false},
		{40000, 5001, 1400, false},
		{40000, 5001, 1400, true}, // data 6
		{40000, 5001, 1400, false},
		{40000, 5001, 1400, false},
		{40000, 5001, 1400, false}, // data 9: past the count
	}
	buf := make([]byte, 2000)
	for i, s := range segs {
		pkt := tcpPacket(t, s.sport, s.dport, s.payload, r)
		if !tcpChecksumOK(pkt) {
			t.Fatalf("segment %d: the test built a bad checksum", i)
		}
		if _, err := unix.Write(in[0], pkt); err != nil {
			t.Fatal(err)
		}
		n, err := unix.Read(out[1], buf)
		if err != nil {
			t.Fatalf("segment %d: %v", i, err)
		}
		got := buf[:n]
		if !tcpChecksumOK(got) {
			t.Errorf("segment %d: delivered with a bad TCP checksum", i)
		}
		diff, at := 0, -1
		for j := range pkt {
			if d := bits.OnesCount8(pkt[j] ^ got[j]); d > 0 && (j < 36 || j > 37) { // 36-37: the checksum
				diff += d
				at = j
			}
		}
		switch {
		case len(got) != len(pkt):
			t.Errorf("segment %d: %d bytes delivered, %d sent", i, len(got), len(pkt))
		case !s.flip && !bytes.Equal(got, pkt):
			t.Errorf("segment %d (%+v) altered", i, s)
		case s.flip && (diff != 1 || at < 40):
			t.Errorf("segment %d: %d bits differ (last at byte %d), want one bit of the payload (from byte 40)", i, diff, at)
		}
	}
	deadline := time.Now().Add(time.Second)
	for l.stats().Tampered != 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := l.stats().Tampered; n != 2 {
		t.Errorf("stats count %d tampered segments, want 2", n)
	}
	if got := applyTamper(links, &Tamper{}); got != "" || l.tamp.Load() != nil {
		t.Errorf("a zero Tamper did not stop tampering: %q", got)
	}
}
