package relay

import (
	"crypto/rand"
	"errors"
	mrand "math/rand/v2"
	"net"
	"sync"
	"testing"

	"github.com/mpi5k/mpi5k/seal"
)

// sealLinks makes the tests' link connections SealedConns (handshaken,
// handshakenH): TestSealed runs other tests over records. With
// sealUpdates the records are mpi5k/3's, whose keys update within those
// limits, and sealedConns collects the connections made.
var (
	sealLinks   bool
	sealUpdates *seal.Limits
	sealedMu    sync.Mutex
	sealedConns []*SealedConn
)

// sealedPair wraps both ends of a connection in SealedConns with fresh
// keys, as the gateway does after TLS.
func sealedPair(t testing.TB, ca, cb net.Conn) (net.Conn, net.Conn) {
	t.Helper()
	if sealUpdates != nil {
		km := make([]byte, seal.SecretsLen)
		rand.Read(km)
		ws, wo, err := seal.UpdatingKeys(seal.AES256GCM, seal.ModeEncrypt, km, true, *sealUpdates)
		if err != nil {
			t.Fatal(err)
		}
		as, ao, _ := seal.UpdatingKeys(seal.AES256GCM, seal.ModeEncrypt, km, false, *sealUpdates)
		a, b := NewSealedConn(ca, ws, wo), NewSealedConn(cb, as, ao)
		sealedMu.Lock()
		sealedConns = append(sealedConns, a, b)
		sealedMu.Unlock()
		return a, b
	}
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

// TestSealedKeyUpdate runs TestSealed's links on mpi5k/3 records whose
// keys update every few records: many updates in both directions of
// every connection while checksummed streams cross (ManyStreams), and
// links that break and resume on new connections, whose keys start
// again from their own secrets (ResumeLossless, TamperResumes), where a
// forged record never opens under any key of the connection.
func TestSealedKeyUpdate(t *testing.T) {
	sealLinks, sealUpdates = true, &seal.Limits{Records: 5, Bytes: 64 << 10}
	t.Cleanup(func() { sealLinks, sealUpdates, sealedConns = false, nil, nil })
	for _, c := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"PollerForwards", TestPollerForwards},
		{"ManyStreams", TestManyStreams},
		{"ResumeLossless", TestResumeLossless},
		{"TamperResumes", testTamperResumes},
	} {
		sealedMu.Lock()
		sealedConns = nil
		sealedMu.Unlock()
		if !t.Run(c.name, c.f) {
			return
		}
		sealedMu.Lock()
		conns := sealedConns
		sealedMu.Unlock()
		var most uint64
		for i := 0; i+1 < len(conns); i += 2 {
			as, ar := conns[i].KeyUpdates()
			bs, br := conns[i+1].KeyUpdates()
			most = max(most, min(as, br), min(bs, ar))
			// A receiver follows no more updates than its peer made (a
			// broken connection loses the records in flight).
			if br > as || ar > bs {
				t.Errorf("%s: connection %d: updates %d sent and %d followed one way, %d and %d the other",
					c.name, i/2, as, br, bs, ar)
			}
		}
		t.Logf("%s: %d connections, up to %d key updates followed in one direction", c.name, len(conns)/2, most)
		if most < 10 {
			t.Errorf("%s: at most %d key updates followed on a connection: the limits forced none", c.name, most)
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
