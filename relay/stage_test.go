package relay

import (
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
)

// TestStageKicks: kicks from many goroutines never run the step twice at
// once, and none is lost: every signal raised before a kick is seen by a
// step that starts after it.
func TestStageKicks(t *testing.T) {
	var g stage
	var mu sync.Mutex
	pending, seen := 0, 0
	var inStep atomic.Int32
	g.step = func(bool) waitOn {
		if inStep.Add(1) != 1 {
			t.Error("two steps at once")
		}
		defer inStep.Add(-1)
		mu.Lock()
		seen += pending
		pending = 0
		mu.Unlock()
		return onSignal
	}
	const senders, each = 8, 2000
	var wg sync.WaitGroup
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				mu.Lock()
				pending++
				mu.Unlock()
				g.kick()
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := seen
		mu.Unlock()
		if n == senders*each && g.state.Load() == stageIdle {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("steps saw %d of %d signals; stage state %d", n, senders*each, g.state.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestIdleStreamsHoldNoGoroutine: with the poller thread, a stream that
// has carried a message each way and then waits holds no goroutine on
// either gateway (its out-stage waits in the poller thread's epoll set,
// its in-stage for a kick), and wakes when the next message comes.
func TestIdleStreamsHoldNoGoroutine(t *testing.T) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, _ := pair(t, Config{PingInterval: time.Hour})
	if a.w == nil {
		t.Skip("no poller thread here")
	}
	const n = 400
	base := runtime.NumGoroutine()
	apps := make([]*net.TCPConn, n)
	dsts := make([]*net.TCPConn, n)
	msg := make([]byte, 100)
	for i := range n {
		apps[i], _ = openVia(t, a, ln.Addr().(*net.TCPAddr).AddrPort())
		defer apps[i].Close()
		if dsts[i], err = ln.AcceptTCP(); err != nil {
			t.Fatal(err)
		}
		defer dsts[i].Close()
	}
	// The destinations are read and written by this goroutine alone, so
	// every goroutine left is the relay's.
	roundTrip := func(i int) {
		t.Helper()
		if _, err := apps[i].Write(msg); err != nil {
			t.Fatal(err)
		}
		dsts[i].SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(dsts[i], msg); err != nil {
			t.Fatal(err)
		}
		if _, err := dsts[i].Write(msg); err != nil {
			t.Fatal(err)
		}
		apps[i].SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(apps[i], msg); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		roundTrip(i)
	}
	// 2 streams (one per gateway) per connection; the workers that ran
	// their stages wait in the pool (at most maxIdleWorkers) or exit. A
	// few stragglers are allowed.
	deadline := time.Now().Add(10 * time.Second)
	for {
		extra := runtime.NumGoroutine() - base
		if extra <= maxIdleWorkers+n/20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d idle streams (each end) hold %d goroutines", n, extra)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range n {
		roundTrip(i)
	}
}

// TestAfterDone: the functions run once the stream ends, also when
// registered after its end.
func TestAfterDone(t *testing.T) {
	a, _ := pair(t, Config{})
	app, s := openVia(t, a, testnet.Echo(t, loopback))
	defer app.Close()
	ran := make(chan int, 2)
	s.AfterDone(func() { ran <- 1 })
	select {
	case <-ran:
		t.Fatal("ran before the stream ended")
	case <-time.After(50 * time.Millisecond):
	}
	s.Reset(0)
	s.AfterDone(func() { ran <- 2 })
	got := 0
	for range 2 {
		select {
		case v := <-ran:
			got += v
		case <-time.After(5 * time.Second):
			t.Fatalf("after the reset, AfterDone functions ran: sum %d of 3", got)
		}
	}
}

// TestStreamsWithoutPoller: without the poller thread the same steps run
// on goroutines that wait in Go's poller: many streams of mixed sizes
// through small windows arrive whole.
func TestStreamsWithoutPoller(t *testing.T) {
	a, _ := pair(t, Config{Chunk: 32 << 10, Window: 128 << 10, NoPoller: true})
	if a.w != nil {
		t.Fatal("NoPoller link registered with the poller thread")
	}
	dst := testnet.Serve(t, loopback, testnet.SumServer)
	runStreams(t, a, dst, 100, 1<<20, 3)
}
