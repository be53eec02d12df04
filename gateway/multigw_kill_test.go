package gateway

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
	"github.com/mpi5k/mpi5k/sitemap"
)

// startGatewayChild starts gateway gw of site as a child process (this
// test binary, see childGateway) with map file mp, and returns it once its
// ready file exists (every link to every gateway of the other sites up).
func startGatewayChild(t testing.TB, mp, dir, site string, gw int, at sitemap.Gateway, flags ...string) *exec.Cmd {
	t.Helper()
	ready := filepath.Join(dir, fmt.Sprintf("%s-%d.ready", site, gw))
	c := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, flags...)...)
	spec := strings.Join([]string{mp, site, ready, "", at.LAN.String(), at.WAN.String()}, ",")
	c.Env = append(os.Environ(), "MPI5K_GW_CHILD="+spec)
	c.Stderr = os.Stderr
	c.SysProcAttr = diesWithParent
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Signal(syscall.SIGTERM); c.Wait() })
	return c
}

// waitReadyFiles waits for the ready files of every gateway in dir.
func waitReadyFiles(t testing.TB, dir string, n int) {
	t.Helper()
	for i := 0; ; i++ {
		fs, _ := filepath.Glob(filepath.Join(dir, "*.ready"))
		if len(fs) == n {
			return
		}
		if i > 1000 {
			t.Fatalf("%d of %d child gateways became ready", len(fs), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startMultiChildren starts every gateway of m (n per site) as a process.
func startMultiChildren(t testing.TB, m *sitemap.Map, flags ...string) map[string][]*exec.Cmd {
	dir := t.TempDir()
	mp := filepath.Join(dir, "sites.conf")
	if err := os.WriteFile(mp, []byte(m.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	procs := map[string][]*exec.Cmd{}
	n := 0
	for _, s := range m.Sites() {
		for i, gw := range s.Gateways {
			procs[s.Name] = append(procs[s.Name], startGatewayChild(t, mp, dir, s.Name, i, gw, flags...))
			n++
		}
	}
	waitReadyFiles(t, dir, n)
	return procs
}

// pacedStream is one checksummed stream of the kill test: its first 8
// bytes are its number, so the destination can tell which gateway
// delivered it; it sends size bytes a chunk every gap, so that it is
// still running when a gateway is killed.
func pacedStream(c *net.TCPConn, id uint64, size int, gap time.Duration) error {
	r := rand.New(rand.NewPCG(id, 33))
	h := sha256.New()
	buf := make([]byte, 32<<10)
	for sent := 0; sent < size; {
		k := min(size-sent, len(buf))
		testnet.Fill(r, buf[:k])
		if sent == 0 {
			binary.BigEndian.PutUint64(buf, id)
		}
		h.Write(buf[:k])
		if _, err := c.Write(buf[:k]); err != nil {
			return fmt.Errorf("write after %d of %d bytes: %w", sent, size, err)
		}
		sent += k
		time.Sleep(gap)
	}
	return testnet.CloseAndCheck(c, h.Sum(nil), size, 60*time.Second)
}

// isReset: the error a rank sees when its stream was cut by a gateway
// that died: a reset, never an end of file or a wrong checksum (silent
// truncation) nor a timeout (a hang).
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// TestMultiGatewayKill: two sites of two gateway hosts each, every
// gateway a process. Checksummed streams run from both gateways of site a
// and land through both gateways of site b; then one gateway host is
// SIGKILLed mid-transfer. Every stream that did not pass through it ends
// intact (not a byte lost), every stream that did ends with a reset at
// its source rank, and streams opened after the kill, the way the shim
// opens them (the next gateway when one refuses), all succeed.
func TestMultiGatewayKill(t *testing.T) {
	for _, victim := range []struct {
		site string
		gw   int
	}{{"a", 1}, {"b", 1}, {"a", 0}} {
		t.Run(fmt.Sprintf("kill-%s%d", victim.site, victim.gw), func(t *testing.T) {
			m := multiMap(t, 2)
			procs := startMultiChildren(t, m)
			a, _ := m.Site("a")
			b, _ := m.Site("b")
			// via[id]: the LAN address of the site b gateway that delivered
			// stream id (the destination's view).
			var mu sync.Mutex
			via := map[uint64]netip.Addr{}
			dst := testnet.Serve(t, nodeB, func(c *net.TCPConn) {
				defer c.Close()
				var head [8]byte
				if _, err := io.ReadFull(c, head[:]); err != nil {
					return
				}
				mu.Lock()
				via[binary.BigEndian.Uint64(head[:])] = c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
				mu.Unlock()
				h := sha256.New()
				h.Write(head[:])
				if _, err := io.Copy(h, c); err != nil {
					return // reset: the source sees it too
				}
				c.Write(h.Sum(nil))
			})
			fresh := testnet.Serve(t, nodeB, testnet.SumServer)
			const streams = 16
			const size = 4 << 20
			const gap = 10 * time.Millisecond // 128 chunks: about 1.3 s and more
			errs := make([]error, streams)
			from := make([]int, streams) // site a gateway each stream opened at
			var wg sync.WaitGroup
			for i := range streams {
				from[i] = i % 2
				c, err := lanOpen(a.Gateways[from[i]].LAN, nodeA, dst)
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer c.Close()
					errs[i] = pacedStream(c, uint64(i), size, gap)
				}()
			}
			// Every stream has reached its destination: kill the victim.
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				mu.Lock()
				n := len(via)
				mu.Unlock()
				if n == streams {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d streams reached their destination", n, streams)
				}
			}
			time.Sleep(300 * time.Millisecond)
			if err := procs[victim.site][victim.gw].Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed := a.Gateways[victim.gw].LAN.Addr()
			if victim.site == "b" {
				killed = b.Gateways[victim.gw].LAN.Addr()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(90 * time.Second):
				t.Fatal("streams still running 90 s after the kill (a hang)")
			}
			mu.Lock()
			defer mu.Unlock()
			carried := map[netip.Addr]int{}
			var intact, reset int
			for i, err := range errs {
				through := via[uint64(i)] == killed || victim.site == "a" && from[i] == victim.gw
				carried[via[uint64(i)]]++
				switch {
				case through && !isReset(err):
					t.Errorf("stream %d through the killed gateway: %v, want a reset", i, err)
				case through:
					reset++
				case err != nil:
					t.Errorf("stream %d (from gateway a%d, via %v) did not pass the killed gateway and failed: %v", i, from[i], via[uint64(i)], err)
				default:
					intact++
				}
			}
			for i, gw := range b.Gateways {
				if carried[gw.LAN.Addr()] == 0 {
					t.Errorf("gateway b%d carried none of the %d streams (%v)", i, streams, carried)
				}
			}
			t.Logf("%d streams intact, %d reset with the killed gateway; delivered through %v", intact, reset, carried)
			if intact == 0 || reset == 0 {
				t.Errorf("%d intact, %d reset: the test did not exercise both", intact, reset)
			}
			// New streams after the kill, opened the way the shim does:
			// from each gateway of site a in turn, the next on failure.
			_, nerrs := testnet.Streams(8, 9, func(r *rand.Rand) int { return testnet.StreamSize(r, 1<<20) },
				func() (*net.TCPConn, func() string, error) {
					var err error
					for k := range a.Gateways {
						var c *net.TCPConn
						if c, err = lanOpen(a.Gateways[(k+victim.gw)%len(a.Gateways)].LAN, nodeA, fresh); err == nil {
							return c, nil, nil
						}
					}
					return nil, nil, err
				})
			for _, err := range nerrs {
				t.Errorf("stream opened after the kill: %v", err)
			}
		})
	}
}
