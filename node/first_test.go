package node

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/header"
	"github.com/mpi5k/mpi5k/mx"
)

func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestBigFirstFrame: any local user can connect to the daemon; 512
// connections whose first frame declares a 1 MiB PAD or DATA (and sends
// a little of it) are reset from their headers and cost the daemon no
// more than them. (A daemon that allocated the declared length held
// 512 MiB until FirstFrame.)
func TestBigFirstFrame(t *testing.T) {
	const n = 512
	hub := mx.NewMemHub(1500)
	gw := endpoint(t, hub.Attach(mx.MAC{2, 0, 0, 0, 9, 1}), mx.Config{})
	ep := endpoint(t, hub.Attach(mx.MAC{2, 0, 0, 0, 9, 2}), mx.Config{})
	d := startDaemon(t, Config{Addr: nodeAddr, NoResume: true, Listen: netip.MustParseAddrPort("127.0.0.2:0"),
		Gateways: []Gateway{{LAN: gwLAN, MX: gw.Addr()}}, EP: ep, MaxConns: 2 * n, FirstFrame: time.Minute})
	before := heapInuse()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range n {
		c, err := net.Dial("tcp", d.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var b [header.Size + 16]byte
		h := header.Header{Type: header.TypePad, Length: header.MaxPayload}
		if i%2 == 1 {
			h = header.Header{Type: header.TypeData, Stream: 1, Length: header.MaxPayload}
		}
		h.Encode(b[:])
		c.Write(b[:])
	}
	// Every connection is reset once the daemon has read its header.
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
			grew := int64(heapInuse()) - int64(before)
			t.Fatalf("connection %d: %v, want a reset (heap grew %.1f MiB)", i, err, float64(grew)/(1<<20))
		}
	}
	grew := int64(heapInuse()) - int64(before)
	t.Logf("heap grew %.1f MiB with %d connections declaring 1 MiB first frames", float64(grew)/(1<<20), n)
	if grew > 32<<20 {
		t.Errorf("heap grew %.1f MiB for %d first-frame headers, want under 32 MiB", float64(grew)/(1<<20), n)
	}
}
