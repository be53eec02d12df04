package relay

import (
	"bytes"
	"crypto/sha256"
	"io"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/internal/testnet"
)

// TestHold: while a link is held nothing reaches its socket, neither a
// bulk write (queued for the writer) nor a small one (inline path); when
// the hold ends every byte goes out in order.
func TestHold(t *testing.T) {
	a, _ := pair(t, Config{Chunk: 16 << 10, Window: 256 << 10})
	dst := testnet.Serve(t, loopback, sumServer)
	app, _ := openVia(t, a, dst)
	defer app.Close()
	data := make([]byte, 1<<20+13)
	for i := range data {
		data[i] = byte(i*31 + i>>11)
	}
	// The first part goes out unheld (the stream is confirmed).
	first := 64 << 10
	if _, err := app.Write(data[:first]); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.Stats.BytesSent.Load() < uint64(first) {
		if time.Now().After(deadline) {
			t.Fatalf("first %d bytes not sent: %d", first, a.Stats.BytesSent.Load())
		}
		time.Sleep(time.Millisecond)
	}
	const hold = 2 * time.Second
	start := time.Now()
	a.Hold(start.Add(hold))
	sent := a.Stats.BytesSent.Load()
	if _, err := app.Write(data[first : first+10]); err != nil { // small: inline path
		t.Fatal(err)
	}
	go app.Write(data[first+10:]) // bulk: blocks once the window is used
	time.Sleep(300 * time.Millisecond)
	if el := time.Since(start); el < hold {
		if got := a.Stats.BytesSent.Load(); got != sent {
			t.Fatalf("%v into a %v hold the link sent %d bytes", el, hold, got-sent)
		}
		if !a.held() {
			t.Fatalf("%v into a %v hold the link is not held", el, hold)
		}
	}
	deadline = time.Now().Add(30 * time.Second)
	for a.Stats.BytesSent.Load() < uint64(len(data)) {
		if time.Now().After(deadline) {
			t.Fatalf("after the hold only %d of %d bytes sent", a.Stats.BytesSent.Load(), len(data))
		}
		time.Sleep(time.Millisecond)
	}
	if el := time.Since(start); el < hold {
		t.Fatalf("all bytes sent %v into a %v hold", el, hold)
	}
	app.CloseWrite()
	got, err := io.ReadAll(app)
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(data)
	if !bytes.Equal(got, want[:]) {
		t.Fatalf("checksum mismatch after the hold: got %x", got)
	}
}
