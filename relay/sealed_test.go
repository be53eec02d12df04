package relay

import (
	"crypto/rand"
	"errors"
	mrand "math/rand/v2"
	"net"
	"testing"

	"github.com/mpi5k/mpi5k/seal"
)

// sealLinks makes the tests' link connections SealedConns (handshaken,
// handshakenH): TestSealed runs other tests over records.
var sealLinks bool

// sealedPair wraps both ends of a connection in SealedConns with fresh
// keys, as the gateway does after TLS.
func sealedPair(t testing.TB, ca, cb net.Conn) (net.Conn, net.Conn) {
	t.Helper()
	km := make([]byte, seal.MaterialLen)
	rand.Read(km)
	ws, wo, err := seal.Keys(seal.AES256GCM, seal.ModeEncrypt, km, true)
	if err != nil {
		t.Fatal(err)
	}
	as, ao, _ := seal.Keys(seal.AES256GCM, seal.ModeEncrypt, km, false)
	return NewSealedConn(ca, ws, wo), NewSealedConn(cb, as, ao)
}

// TestSealed runs links over SealedConns: small messages on the poller
// thread (including its non-blocking writes that the socket takes only
// in part), many streams of every size, and links that break and resume
// on new connections with new keys.
func TestSealed(t *testing.T) {
	sealLinks = true
	t.Cleanup(func() { sealLinks = false })
	for _, c := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"PollerForwards", TestPollerForwards},
		{"PollerPartialWrite", TestPollerPartialWrite},
		{"ManyStreams", TestManyStreams},
		{"HalfClose", TestHalfClose},
		{"ResumeLossless", TestResumeLossless},
		{"TamperResumes", testTamperResumes},
	} {
		if !t.Run(c.name, c.f) {
			return
		}
	}
}

// testTamperResumes: bytes that are not the peer's records (written on
// the raw socket under a link's SealedConn) fail a record at the far
// end, which breaks the connection and alerts this end; both resume on
// a new connection, and the checksummed streams crossing the trunk
// meanwhile see no error and no wrong byte.
func testTamperResumes(t *testing.T) {
	cfg := Config{Chunk: 32 << 10, Window: 256 << 10, ExpressMax: 4 << 10, Logger: testLogger(t)}
	_, _, as, bs := resumingPair(t, cfg, 1)
	total, tampered := breakWhileStreaming(t, cfg, as, bs, 50, 1<<20, 11, 5, func(r *mrand.Rand, i int) {
		from, to := as[i], bs[i]
		if r.IntN(2) == 1 {
			from, to = to, from
		}
		// A whole forged record (length field, body, tag), so the far end
		// fails it at once, also where the link's other direction is quiet.
		forged := make([]byte, seal.PrefixSize+seal.TagSize+8)
		forged[seal.PrefixSize-1] = byte(len(forged) - seal.PrefixSize)
		TCPOf(from.Conn()).Write(forged)
		waitDown(t, as[i], bs[i])
		if err := downErr(to); !errors.Is(err, seal.ErrAuth) && !errors.Is(err, seal.ErrRecordSize) {
			t.Errorf("link %d: the tampered end went down with %v, want a failed record", i, err)
		}
	})
	for i := range as {
		if err := as[i].Err(); err != nil {
			t.Fatalf("link %d failed: %v", i, err)
		}
	}
	if tampered < 5 {
		t.Fatalf("%d tamperings: the test did not break the links", tampered)
	}
	t.Logf("%d bytes in checksummed streams across %d tampered connections", total, tampered)
}

// downErr is why the down link l's connection broke.
func downErr(l *Link) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rs.downErr
}

// BenchmarkSealedStream is BenchmarkStream (pipeline=1) over sealed links.
func BenchmarkSealedStream(b *testing.B) {
	sealLinks = true
	b.Cleanup(func() { sealLinks = false })
	BenchmarkStream(b)
}
