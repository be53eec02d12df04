package trace

import (
	"bytes"
	"encoding/json"
	"flag"
	"image/png"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
)

var update = flag.Bool("update", false, "rewrite golden files")

// fileBuilder writes one synthetic trace file with trace's own encoder.
type fileBuilder struct {
	h    Header
	recs []Record
}

const testMono = 1_000_000_000 // monotonic anchor of every synthetic file
var testWall = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC).UnixNano()

func newFile(host string, pid uint32, siteID uint8, site string) *fileBuilder {
	return &fileBuilder{h: Header{Wall: testWall, Mono: testMono, PID: pid, SiteID: siteID, Host: host, Site: site}}
}

// at: monotonic time of an offset from the anchor.
func at(d time.Duration) uint64 { return testMono + uint64(d) }

func (f *fileBuilder) conn(t time.Duration, fd int32, fn Func, local, peer string, flags uint16, peerSite uint8) {
	f.recs = append(f.recs, Record{Mono: at(t), Kind: KindConn, Fn: fn, FD: fd, Flags: flags,
		Local: netip.MustParseAddrPort(local), Peer: netip.MustParseAddrPort(peer), Site: peerSite})
}

func (f *fileBuilder) call(t time.Duration, fd int32, fn Func, ret int64) {
	f.recs = append(f.recs, Record{Mono: at(t), Kind: KindCall, Fn: fn, FD: fd, Ret: ret, Req: uint64(max(ret, 0)), Dur: time.Microsecond})
}

func (f *fileBuilder) writes(start time.Duration, fd int32, n int, every time.Duration, size int64) {
	for i := range n {
		f.call(start+time.Duration(i)*every, fd, FnSendmsg, size)
	}
}

func (f *fileBuilder) sample(t time.Duration, fd int32, s TCPSample) {
	f.recs = append(f.recs, Record{Mono: at(t), Kind: KindSample, FD: fd, TCP: s})
}

func (f *fileBuilder) save(t *testing.T, dir string) {
	t.Helper()
	b := f.h.Encode(nil)
	for i := range f.recs {
		b = f.recs[i].Encode(b)
	}
	name := filepath.Join(dir, f.h.Host+"."+itoa(f.h.PID)+".trace")
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// twoSites writes the reference trace: sites a (a1, a2) and b (b1).
func twoSites(t *testing.T, headerSites bool) string {
	dir := t.TempDir()
	sa, sb := "a", "b"
	ida, idb := uint8(1), uint8(2)
	if !headerSites {
		sa, sb, ida, idb = "", "", 0, 0
	}
	a1 := newFile("a1", 100, ida, sa)
	// WAN, relayed: 10 small and 10 large writes, 10 ms apart.
	a1.conn(0, 5, FnConnect, "10.1.0.1:40000", "10.2.0.1:5000", FlagRelayed, idb)
	a1.sample(time.Millisecond, 5, TCPSample{Cwnd: 10, Unacked: 0, MSS: 1448, When: SampleOpen})
	a1.writes(10*time.Millisecond, 5, 10, 10*time.Millisecond, 100)
	a1.writes(110*time.Millisecond, 5, 10, 10*time.Millisecond, 1<<20)
	a1.sample(150*time.Millisecond, 5, TCPSample{Cwnd: 40, Unacked: 30, MSS: 1448, TotalRetrans: 2, RetransFast: 2, When: SamplePeriodic})
	a1.sample(220*time.Millisecond, 5, TCPSample{Cwnd: 12, Unacked: 2, MSS: 1448, TotalRetrans: 5, RetransFast: 3, RetransRTO: 2, RTOs: 1, IdleRestarts: 2, When: SampleClose})
	a1.call(221*time.Millisecond, 5, FnClose, 0)
	// fd 5 reused: a second WAN connection, one write.
	a1.conn(300*time.Millisecond, 5, FnConnect, "10.1.0.1:40002", "10.2.0.1:5000", FlagRelayed, idb)
	a1.writes(301*time.Millisecond, 5, 1, 0, 64)
	// LAN: 4 x 20 KiB to a2, and reads.
	a1.conn(0, 6, FnConnect, "10.1.0.1:40001", "10.1.0.2:6000", 0, 0)
	a1.writes(5*time.Millisecond, 6, 4, 50*time.Millisecond, 20<<10)
	a1.call(6*time.Millisecond, 6, FnRecv, 300)
	// Loopback control connection.
	a1.conn(0, 8, FnConnect, "127.0.0.1:41000", "127.0.0.1:7000", 0, 0)
	a1.writes(0, 8, 2, time.Millisecond, 16)
	// Records lost once.
	a1.recs = append(a1.recs, Record{Mono: at(400 * time.Millisecond), Kind: KindLost, FD: -1, Ret: 7})
	a1.save(t, dir)

	a2 := newFile("a2", 200, ida, sa)
	a2.conn(time.Millisecond, 9, FnAccept, "10.1.0.2:6000", "10.1.0.1:40001", 0, 0)
	a2.writes(2*time.Millisecond, 9, 1, 0, 8)
	a2.save(t, dir)

	b1 := newFile("b1", 300, idb, sb)
	b1.conn(2*time.Millisecond, 7, FnAccept, "10.2.0.1:5000", "10.1.0.1:40000", FlagTruePeer, ida)
	b1.writes(20*time.Millisecond, 7, 3, 10*time.Millisecond, 8)
	// A data call on an fd whose connection started before tracing.
	b1.writes(30*time.Millisecond, 11, 1, 0, 1000)
	b1.save(t, dir)
	return dir
}

func pairOf(ps []*PairReport, from, to string) *PairReport {
	for _, p := range ps {
		if p.From == from && p.To == to {
			return p
		}
	}
	return nil
}

func TestReportAggregation(t *testing.T) {
	dir := twoSites(t, true)
	tr, err := Load(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Procs) != 3 {
		t.Fatalf("%d procs, want 3", len(tr.Procs))
	}
	r := NewReport(tr)
	// WAN: a1 -> b1 twice (21 writes), b1 -> a1 (3 writes) on the first
	// of them: 3 traced sockets, 2 connections.
	if r.WAN.Conns != 2 || r.WAN.Sockets != 3 || r.WAN.Writes != 24 {
		t.Errorf("WAN conns %d sockets %d writes %d, want 2, 3, 24", r.WAN.Conns, r.WAN.Sockets, r.WAN.Writes)
	}
	wantBytes := int64(10*100 + 10<<20 + 64 + 3*8)
	if r.WAN.Bytes != wantBytes {
		t.Errorf("WAN bytes %d, want %d", r.WAN.Bytes, wantBytes)
	}
	ab := pairOf(r.SitePairs, "a", "b")
	if ab == nil {
		t.Fatalf("no site pair a->b in %+v", r.SitePairs)
	}
	if ab.Writes != 21 || ab.Min != 64 || ab.Max != 1<<20 || ab.Median != 100 || ab.P90 != 1<<20 || ab.Scope != ScopeWAN || ab.WANConns != 2 {
		t.Errorf("a->b: writes %d min %d median %d p90 %d max %d scope %s wan %d", ab.Writes, ab.Min, ab.Median, ab.P90, ab.Max, ab.Scope, ab.WANConns)
	}
	// Histogram: 64 B and 10 x 100 B below 1 KiB, 10 x 1 MiB in [1M, 4M).
	wantHist := []int{0, 11, 0, 0, 0, 0, 10, 0}
	if !equalInts(ab.Hist, wantHist) {
		t.Errorf("a->b histogram %v, want %v", ab.Hist, wantHist)
	}
	// Mean gap: first connection 20 writes over 190 ms; the second has one
	// write (no gap).
	if g := time.Duration(ab.MeanGap * 1e9); g != 10*time.Millisecond {
		t.Errorf("a->b mean gap %v, want 10ms", g)
	}
	// TCP counters from the last sample of the sampled connection only.
	if ab.Sampled != 1 || ab.Retrans != 5 || ab.RetransFast != 3 || ab.RetransRTO != 2 || ab.RTOs != 1 || ab.IdleRestarts != 2 {
		t.Errorf("a->b tcp: sampled %d retrans %d fast %d rto %d rtos %d idle %d", ab.Sampled, ab.Retrans, ab.RetransFast, ab.RetransRTO, ab.RTOs, ab.IdleRestarts)
	}
	if p := pairOf(r.SitePairs, "b", "a"); p == nil || p.Writes != 3 || p.Bytes != 24 {
		t.Errorf("b->a: %+v", p)
	}
	// b1's anonymous fd 11 has no peer: unknown scope.
	if p := pairOf(r.HostPairs, "b1", UnknownSite); p == nil || p.Scope != ScopeUnknown || p.Writes != 1 {
		t.Errorf("b1 -> ?: %+v", p)
	}
	// Host pairs resolve the peer address through the other files.
	if p := pairOf(r.HostPairs, "a1", "a2"); p == nil || p.Scope != ScopeLAN || p.Writes != 4 || p.Bytes != 4*20<<10 {
		t.Errorf("a1->a2: %+v", p)
	}
	if p := pairOf(r.HostPairs, "a1", "a1"); p == nil || p.Scope != ScopeLocal || p.Writes != 2 {
		t.Errorf("a1->a1 (loopback): %+v", p)
	}
	// fd reuse makes two connection ids; relayed flags on both sides.
	ids := map[string]*ConnReport{}
	for _, c := range r.Connections {
		ids[c.Conn.ID] = c
	}
	if c := ids["a1.100.5"]; c == nil || c.Stats.Writes != 20 || !c.Conn.Relayed || c.Conn.End == 0 {
		t.Errorf("a1.100.5: %+v", c)
	}
	if c := ids["a1.100.5-2"]; c == nil || c.Stats.Writes != 1 {
		t.Errorf("a1.100.5-2: %+v", c)
	}
	if c := ids["b1.300.7"]; c == nil || !c.Conn.Accepted || !c.Conn.Relayed || c.Conn.PeerHost != "a1" || c.Conn.PeerSite != "a" {
		t.Errorf("b1.300.7: %+v", c.Conn)
	}
	if c := ids["a1.100.6"]; c == nil || c.Conn.Read != 300 {
		t.Errorf("a1.100.6 read: %+v", c)
	}
	if tr.Procs[0].Lost != 7 {
		t.Errorf("lost %d, want 7", tr.Procs[0].Lost)
	}
	// Busiest WAN connection for the timeline.
	if c := BusiestConn(tr); c.ID != "a1.100.5" {
		t.Errorf("busiest %s", c.ID)
	}
	var txt bytes.Buffer
	if err := r.WriteText(&txt); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"7 records LOST", "a1.100.5-2", "5 (3 fast, 2 rto)", "site pairs"} {
		if !strings.Contains(txt.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, txt.String())
		}
	}
	js, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if back["wan"].(map[string]any)["writes"].(float64) != 24 {
		t.Errorf("json wan writes: %v", back["wan"])
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Without site names in the headers, a site map places the hosts.
func TestReportSiteMap(t *testing.T) {
	dir := twoSites(t, false)
	tr, err := Load(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := NewReport(tr); r.WAN.Conns != 0 {
		t.Errorf("without sites: %d WAN conns, want 0", r.WAN.Conns)
	}
	m, err := sitemap.NewBuilder().
		AddSite("a", 1, netip.MustParseAddrPort("10.1.0.254:7000"), netip.MustParseAddrPort("192.168.0.1:7001")).
		AddNet("a", netip.MustParsePrefix("10.1.0.0/24")).
		AddSite("b", 2, netip.MustParseAddrPort("10.2.0.254:7000"), netip.MustParseAddrPort("192.168.0.2:7001")).
		AddNet("b", netip.MustParsePrefix("10.2.0.0/24")).Build()
	if err != nil {
		t.Fatal(err)
	}
	tr, err = Load(dir, m)
	if err != nil {
		t.Fatal(err)
	}
	r := NewReport(tr)
	if r.WAN.Conns != 2 || pairOf(r.SitePairs, "a", "b") == nil {
		t.Errorf("with map: %d WAN conns, pairs %v", r.WAN.Conns, r.SitePairs)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir, nil); err == nil || !strings.Contains(err.Error(), "no *.trace files") {
		t.Errorf("empty dir: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "nope"), nil); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("missing dir: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "x.1.trace"), []byte("not a trace file at all, but long enough to hold a header...................................................................."), 0o644)
	if _, err := Load(dir, nil); err == nil || !strings.Contains(err.Error(), "x.1.trace") {
		t.Errorf("bad magic: %v", err)
	}
	// A truncated last record is tolerated and flagged.
	f := newFile("h", 1, 0, "")
	f.writes(0, 3, 2, time.Millisecond, 10)
	b := f.h.Encode(nil)
	for i := range f.recs {
		b = f.recs[i].Encode(b)
	}
	os.WriteFile(filepath.Join(dir, "x.1.trace"), b[:len(b)-10], 0o644)
	tr, err := Load(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Procs[0].Truncated || len(tr.Conns) != 1 || len(tr.Conns[0].Writes) != 1 {
		t.Errorf("truncated: %+v conns %d", tr.Procs[0], len(tr.Conns))
	}
}

func TestSampleRecordRoundTrip(t *testing.T) {
	s := TCPSample{Cwnd: 1, Ssthresh: 2, Unacked: 3, MSS: 4, RTT: 5 * time.Microsecond, TotalRetrans: 6, RetransFast: 7,
		RetransRTO: 8, RTOs: 9, IdleRestarts: 10, CAState: 4, When: SampleClose}
	r := Record{Mono: 11, TID: 12, FD: 13, Kind: KindSample, TCP: s}
	b := r.Encode(nil)
	got, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.TCP != s || got.FD != 13 || got.Mono != 11 {
		t.Errorf("round trip: %+v", got)
	}
	if s.InFlight() != 12 || s.CwndBytes() != 4 {
		t.Errorf("InFlight %d CwndBytes %d", s.InFlight(), s.CwndBytes())
	}
}

// classDir writes one file per sender, each with a WAN connection, writes
// from gen.
func classDir(t *testing.T, senders int, gen func(i int, f *fileBuilder)) *Report {
	dir := t.TempDir()
	for i := range senders {
		f := newFile("a"+itoa(uint32(i)), uint32(100+i), 1, "a")
		f.conn(0, 5, FnConnect, "10.1.0."+itoa(uint32(i+1))+":40000", "10.2.0.1:5000", FlagRelayed, 2)
		gen(i, f)
		f.save(t, dir)
	}
	newFile("b1", 999, 2, "b").save(t, dir) // names site 2
	tr, err := Load(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return NewReport(tr)
}

func TestClassification(t *testing.T) {
	// LU-like: one sender, 1 KiB every 4 ms.
	c := classDir(t, 1, func(_ int, f *fileBuilder) { f.writes(0, 5, 200, 4*time.Millisecond, 1<<10) }).Class
	if c.Frequency != "frequent" || c.Size != "small" || c.Sync != "single-sender" {
		t.Errorf("LU-like: %+v", c)
	}
	// FT-like Alltoall: 4 senders write 100 B then 2 MiB at the same
	// instants every 4 s.
	c = classDir(t, 4, func(i int, f *fileBuilder) {
		for k := range 5 {
			s := time.Duration(k)*4*time.Second + time.Duration(i)*100*time.Microsecond
			f.call(s, 5, FnWritev, 100)
			f.call(s+time.Millisecond, 5, FnWritev, 2<<20)
		}
	}).Class
	if c.Frequency != "rare" || c.Size != "mixed" || c.Sync != "synchronous" || c.Bursts != 5 || c.SyncBursts != 5 {
		t.Errorf("FT-like: %+v", c)
	}
	// BT-like, staggered: 2 senders, 160 KiB every 300 ms, offset 150 ms.
	c = classDir(t, 2, func(i int, f *fileBuilder) {
		f.writes(time.Duration(i)*150*time.Millisecond, 5, 10, 300*time.Millisecond, 160<<10)
	}).Class
	if c.Frequency != "intermittent" || c.Size != "large" || c.Sync != "asynchronous" {
		t.Errorf("staggered: %+v", c)
	}
	// Medium messages: 26 KiB.
	c = classDir(t, 1, func(_ int, f *fileBuilder) { f.writes(0, 5, 10, 10*time.Millisecond, 26<<10) }).Class
	if c.Size != "medium" {
		t.Errorf("26 KiB: %+v", c)
	}
}

func TestGraphDOTGolden(t *testing.T) {
	tr, err := Load(twoSites(t, true), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := NewReport(tr)
	r.Dir = "testdir" // the temporary directory would change the title
	var b bytes.Buffer
	if err := WriteDOT(&b, r); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "graph.dot.golden")
	if *update {
		os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("DOT differs from %s:\n%s", golden, b.String())
	}
	// Independent of the golden file: the WAN edge is red, LAN blue, the
	// loopback pair is not drawn, the untraced peer has no box.
	s := b.String()
	for _, want := range []string{`"a1" -> "b1" [dir=both, color=red`, `"a1" -> "a2" [dir=both, color=blue`, `"?" -> "b1" [dir=back, color=gray50`, `label="site a"`, `label="site b"`} {
		if !strings.Contains(s, want) {
			t.Errorf("DOT lacks %q", want)
		}
	}
	if strings.Contains(s, `"a1" -> "a1"`) {
		t.Error("loopback edge drawn")
	}
	if _, err := exec.LookPath("dot"); err == nil {
		svg, err := RenderDOT(b.Bytes(), "svg")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("a1")) {
			t.Errorf("dot output is not an SVG with the hosts")
		}
	}
}

func TestRenderDOTMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := RenderDOT([]byte("digraph{}"), "svg"); err != ErrNoDot {
		t.Errorf("err %v, want ErrNoDot", err)
	}
}

func TestTimelinePNG(t *testing.T) {
	tr, err := Load(twoSites(t, true), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := BusiestConn(tr)
	var b bytes.Buffer
	if err := Timeline(&b, c, "png"); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	// Non-empty: more than a handful of distinct colours (axes, the
	// writes, the cwnd and in-flight lines).
	colours := map[[4]uint32]bool{}
	bd := img.Bounds()
	for y := bd.Min.Y; y < bd.Max.Y; y += 2 {
		for x := bd.Min.X; x < bd.Max.X; x += 2 {
			r, g, bl, a := img.At(x, y).RGBA()
			colours[[4]uint32{r, g, bl, a}] = true
		}
	}
	if bd.Dx() < 500 || len(colours) < 10 {
		t.Errorf("PNG %v with %d colours", bd, len(colours))
	}
	var svg bytes.Buffer
	if err := Timeline(&svg, c, "svg"); err != nil || !bytes.Contains(svg.Bytes(), []byte("<svg")) {
		t.Errorf("svg: %v", err)
	}
	if err := Timeline(&svg, c, "gif"); err == nil {
		t.Error("gif accepted")
	}
	if _, err := FindConn(tr, "nope"); err == nil || !strings.Contains(err.Error(), "a1.100.5") {
		t.Errorf("FindConn: %v", err)
	}
}
