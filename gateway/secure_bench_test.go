package gateway

import (
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
)

// startSecureChildren starts the child gateway pair with a keyed map (TLS
// and sealed records on every WAN link) or, keyed false, the same map
// without keys.
func startSecureChildren(b testing.TB, keyed bool, flags ...string) *childPair {
	lanA, wanA, lanB, wanB := ports(b)
	if !keyed {
		return startChildrenMap(b, keyedMap(b, lanA, wanA, lanB, wanB, nil), nil, flags...)
	}
	dir := b.TempDir()
	files := map[string]string{}
	ks := siteKeys{}
	for _, s := range []string{"a", "b"} {
		files[s] = filepath.Join(dir, s+".key")
		if _, err := GenerateKey(files[s]); err != nil {
			b.Fatal(err)
		}
		k, err := LoadKey(files[s])
		if err != nil {
			b.Fatal(err)
		}
		ks[s] = k
	}
	return startChildrenMap(b, keyedMap(b, lanA, wanA, lanB, wanB, ks), files, flags...)
}

// BenchmarkSecure: the cost of keyed WAN links, plaintext (a map without
// keys), encrypted records and integrity-only ones (--wan-encrypt=false)
// side by side and alternating (run it with -count): the 1-byte round
// trip through the pair (ns/op; goal: at most 5 µs more than plaintext)
// and one bulk stream's rate per CPU-second of each gateway (goal: at
// least 80 % of plaintext). Both gateways run in processes of their own,
// as in BenchmarkPingPong's "gateway" row.
func BenchmarkSecure(b *testing.B) {
	modes := []struct {
		name  string
		keyed bool
		flags []string
	}{{"plain", false, nil}, {"encrypt", true, nil}, {"integrity", true, []string{"--wan-encrypt=false"}}}
	for _, m := range modes {
		b.Run("pingpong/"+m.name, func(b *testing.B) {
			dst := testnet.Serve(b, nodeB, echoServer)
			cp := startSecureChildren(b, m.keyed, m.flags...)
			c, err := lanOpen(cp.lan("a"), nodeA, dst)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			pingPong(b, c)
		})
	}
	for _, m := range modes {
		b.Run("forward/"+m.name, func(b *testing.B) {
			cp := startSecureChildren(b, m.keyed, m.flags...)
			done := make(chan int64, 1)
			dst := testnet.Serve(b, nodeB, func(c *net.TCPConn) { n, _ := io.Copy(io.Discard, c); done <- n })
			c, err := lanOpen(cp.lan("a"), nodeA, dst)
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 1<<20)
			b.SetBytes(int64(len(buf)))
			ca, cb := cpuTime(cp.a.Process.Pid), cpuTime(cp.b.Process.Pid)
			start := time.Now()
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			c.CloseWrite()
			n := <-done
			el := time.Since(start)
			c.Close()
			da, db := cpuTime(cp.a.Process.Pid)-ca, cpuTime(cp.b.Process.Pid)-cb
			b.ReportMetric(float64(n)*8/el.Seconds()/1e9, "Gbit/s")
			if da > 0 && db > 0 {
				b.ReportMetric(float64(n)*8/da.Seconds()/1e9, "Gbit/s-per-core-a")
				b.ReportMetric(float64(n)*8/db.Seconds()/1e9, "Gbit/s-per-core-b")
			}
		})
	}
}
