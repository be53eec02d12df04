package testnet

import (
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ClientHello is the first TLS record of a client offering proto: what a
// stranger that has read a gateway's source would send.
func ClientHello(t testing.TB, proto string) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer s.Close()
	go func() {
		tls.Client(c, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{proto}}).Handshake()
		c.Close()
	}()
	var hdr [5]byte
	if _, err := io.ReadFull(s, hdr[:]); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(s, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr[:], body...)
}

// Flood is strangers connecting to a TLS port, each worker in its way:
// connect and send nothing, send half of Hello and stop, send Junk bytes
// of garbage, send Hello a byte every 100 ms, or send it whole (the server
// answers with its flight). Each connection lasts until the server ends
// it or 4 s pass.
type Flood struct {
	Target  netip.AddrPort
	Source  func(i int) netip.Addr // the i-th of Sources addresses
	Sources int
	Workers int
	Hello   []byte // a ClientHello
	Junk    int    // bytes of garbage the garbage kind sends
	Seed    uint64
	Reset   bool // close with RST, as a flood does (no TIME_WAIT of ours)
}

// Start starts the flood; stop ends it and returns the connections made.
func (f Flood) Start() (stop func() int64) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var conns atomic.Int64
	stopped := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	hello := f.Hello
	for w := range f.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), f.Seed))
			buf := make([]byte, 512)
			for !stopped() {
				src := f.Source(r.IntN(f.Sources))
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}, Timeout: time.Second}
				c, err := d.Dial("tcp", f.Target.String())
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				conns.Add(1)
				end := time.Now().Add(4 * time.Second)
				alive := func(d time.Duration) bool { // false once the server ended it
					c.SetReadDeadline(time.Now().Add(d))
					_, err := c.Read(buf)
					return err == nil || errors.Is(err, os.ErrDeadlineExceeded)
				}
				switch w % 5 {
				case 0: // nothing
				case 1:
					c.Write(hello[:len(hello)/2])
				case 4: // the server's flight costs it a key exchange and a signature
					c.Write(hello)
					alive(time.Second) // the flight; then at once the next one
					end = time.Now()
				case 2:
					junk := make([]byte, f.Junk)
					for k := range junk {
						junk[k] = byte(r.Uint32())
					}
					c.Write(junk)
				case 3:
					for k := 0; k < len(hello) && !stopped() && time.Now().Before(end); k++ {
						if _, err := c.Write(hello[k : k+1]); err != nil || !alive(100*time.Millisecond) {
							break
						}
					}
				}
				for !stopped() && time.Now().Before(end) && alive(200*time.Millisecond) {
				}
				if tc, ok := c.(*net.TCPConn); ok && f.Reset {
					tc.SetLinger(0)
				}
				c.Close()
				time.Sleep(time.Millisecond)
			}
		}()
	}
	return func() int64 {
		close(done)
		wg.Wait()
		return conns.Load()
	}
}
