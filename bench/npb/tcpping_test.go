package npb

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// relay forwards every connection of ln to dst, flipping one byte of the
// server's answer when corrupt is set (a broken relay in the chain).
func relay(t *testing.T, ln net.Listener, dst string, corrupt bool) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d, err := net.Dial("tcp", dst)
			if err != nil {
				c.Close()
				return
			}
			go func() { _, _ = io.Copy(d, c); d.Close() }()
			go func() {
				defer c.Close()
				buf := make([]byte, 32<<10)
				flipped := false
				for {
					n, err := d.Read(buf)
					if n > 0 {
						if corrupt && !flipped && n > 6 {
							buf[6] ^= 0xff
							flipped = true
						}
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
}

func TestTCPPingThroughRelayChain(t *testing.T) {
	server := listen(t)
	go func() { _ = ServeEcho(server) }()
	hop2, hop1 := listen(t), listen(t)
	relay(t, hop2, server.Addr().String(), false)
	relay(t, hop1, hop2.Addr().String(), false)

	c, err := net.Dial("tcp", hop1.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	pts, err := TCPPing(c, TCPPingOptions{MinSize: 1, MaxSize: 1 << 20, Step: 4, Reps: 5, Warmup: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != 11 || pts[0].Size != 1 || pts[10].Size != 1<<20 {
		t.Fatalf("sizes: %+v", pts)
	}
	var out bytes.Buffer
	WriteTCPPing(&out, pts, time.Since(start))
	o, err := ParseOutput(bytes.NewReader(out.Bytes()))
	if err != nil || len(o.Results) != 1 || o.Results[0].MPI != "tcp" || len(o.PingPong) != 11 {
		t.Fatalf("output not readable by the runner: %v %+v", err, o)
	}
	if s := judge(Cell{Workload: "pingpong", Mode: "relay"}, out.Bytes(), nil); !s.OK() {
		t.Errorf("judge: %+v", s)
	}
}

func TestTCPPingDetectsCorruption(t *testing.T) {
	server := listen(t)
	go func() { _ = ServeEcho(server) }()
	hop := listen(t)
	relay(t, hop, server.Addr().String(), true)
	c, err := net.Dial("tcp", hop.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = TCPPing(c, TCPPingOptions{MinSize: 64, MaxSize: 64, Step: 4, Reps: 3})
	if err == nil || !strings.Contains(err.Error(), "VERIFICATION FAILED") {
		t.Fatalf("corrupted echo not detected: %v", err)
	}
	if _, err := TCPPing(c, TCPPingOptions{MinSize: 8, MaxSize: 4, Step: 4, Reps: 1}); err == nil {
		t.Error("min > max accepted")
	}
}
