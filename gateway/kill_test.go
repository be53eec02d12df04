package gateway

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
)

// TestKilledGatewayResets runs the gateways as processes and SIGKILLs one
// mid-stream: both ranks must see ECONNRESET, never an end of file that
// makes the cut stream look complete. A stream that ended before still
// ends with a clean EOF.
func TestKilledGatewayResets(t *testing.T) {
	for _, victim := range []string{"b", "a"} {
		t.Run("kill-"+victim, func(t *testing.T) {
			cp := startChildren(t)
			// A graceful stream first: the linger 0 the gateway keeps on
			// LAN sockets must not cut a stream that really ended.
			dst := testnet.Serve(t, nodeB, testnet.SumServer)
			c, err := lanOpen(cp.lan("a"), nodeA, dst)
			if err != nil {
				t.Fatal(err)
			}
			if err := testnet.SendAndCheck(c, rand.New(rand.NewPCG(2, 2)), 1<<20); err != nil {
				t.Fatalf("graceful stream: %v", err)
			}
			c.Close()

			// A stream cut mid-way by the death of a gateway.
			got := make(chan error, 1)
			started := make(chan struct{})
			sink := testnet.Serve(t, nodeB, func(c *net.TCPConn) {
				if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
					got <- err
					return
				}
				close(started)
				_, err := io.Copy(io.Discard, c)
				got <- err
			})
			c, err = lanOpen(cp.lan("a"), nodeA, sink)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("head")); err != nil {
				t.Fatal(err)
			}
			select {
			case <-started:
			case err := <-got:
				t.Fatalf("destination: %v before the stream started", err)
			case <-time.After(10 * time.Second):
				t.Fatal("stream did not start")
			}
			proc := cp.a.Process
			if victim == "b" {
				proc = cp.b.Process
			}
			if err := proc.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("destination rank after gateway %s was killed: read ended with %v, want ECONNRESET", victim, err)
				}
			case <-time.After(15 * time.Second):
				t.Fatalf("destination rank saw nothing 15 s after gateway %s was killed", victim)
			}
			c.SetReadDeadline(time.Now().Add(15 * time.Second))
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("source rank after gateway %s was killed: read ended with %v, want ECONNRESET", victim, err)
			}
		})
	}
}
