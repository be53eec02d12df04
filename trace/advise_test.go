package trace

import (
	"strings"
	"testing"
	"time"
)

// bestCut finds the smallest cut over every placement that fits caps.
func bestCut(w [][]int64, caps []int) int64 {
	n := len(w)
	part := make([]int, n)
	left := append([]int(nil), caps...)
	best := int64(-1)
	var rec func(i int)
	rec = func(i int) {
		if i == n {
			if c := cut(w, part); best < 0 || c < best {
				best = c
			}
			return
		}
		for s := range left {
			if left[s] > 0 {
				left[s]--
				part[i] = s
				rec(i + 1)
				left[s]++
			}
		}
	}
	rec(0)
	return best
}

func counts(part []int, k int) []int {
	c := make([]int, k)
	for _, s := range part {
		c[s]++
	}
	return c
}

// planted: ranks i and j talk heavily when i%k == j%k, lightly (a
// deterministic pseudo-random amount) otherwise. The best placement puts
// each residue class in one site; the run placed ranks in blocks.
func planted(n, k int) (w [][]int64, init []int) {
	w = square(n)
	x := uint64(12345)
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			x = x*6364136223846793005 + 1442695040888963407
			v := int64(x>>40) % 1000
			if i%k == j%k {
				v += 1 << 20
			}
			w[i][j], w[j][i] = v, v
		}
	}
	init = make([]int, n)
	for i := range init {
		init[i] = i / (n / k)
	}
	return w, init
}

func TestPartitionFindsBest(t *testing.T) {
	for _, c := range []struct{ n, k int }{{8, 2}, {12, 3}, {12, 2}, {8, 4}} {
		w, init := planted(c.n, c.k)
		caps := counts(init, c.k)
		got := Partition(w, caps, init)
		if gc := counts(got, c.k); !equalInts(gc, caps) {
			t.Fatalf("n=%d k=%d: sites hold %v ranks, want %v", c.n, c.k, gc, caps)
		}
		want := bestCut(w, caps)
		if cut(w, got) != want {
			t.Errorf("n=%d k=%d: cut %d, best is %d (from %d)", c.n, c.k, cut(w, got), want, cut(w, init))
		}
		// Each start alone: the refinement from the run's blocks, and the
		// greedy placement, find it too.
		if kl := klRefine(w, c.k, append([]int(nil), init...)); cut(w, kl) != want {
			t.Errorf("n=%d k=%d: refinement from the blocks: cut %d, best %d", c.n, c.k, cut(w, kl), want)
		}
		if gr := greedyPlace(w, caps); cut(w, gr) != want {
			t.Errorf("n=%d k=%d: greedy placement: cut %d, best %d", c.n, c.k, cut(w, gr), want)
		}
		for i := range got { // residue classes together
			if got[i] != got[i%c.k] {
				t.Errorf("n=%d k=%d: rank %d in site %d, rank %d in %d", c.n, c.k, i, got[i], i%c.k, got[i%c.k])
			}
		}
	}
	// Already best: nothing moves.
	w, _ := planted(8, 2)
	best := []int{0, 1, 0, 1, 0, 1, 0, 1}
	if got := Partition(w, []int{4, 4}, best); cut(w, got) != cut(w, best) {
		t.Errorf("moved away from the best placement: %v", got)
	}
}

// Unequal site sizes: 6 ranks, sites of 4 and 2; ranks 4 and 5 talk
// only to each other, 0-3 among themselves but started split.
func TestPartitionUnequalSites(t *testing.T) {
	w := square(6)
	link := func(i, j int, v int64) { w[i][j], w[j][i] = v, v }
	for i := 0; i < 4; i++ {
		for j := i + 1; j < 4; j++ {
			link(i, j, 100)
		}
	}
	link(4, 5, 1000)
	init := []int{0, 0, 0, 1, 0, 1} // ranks 3 and 5 in the small site
	got := Partition(w, []int{4, 2}, init)
	if want := []int{0, 0, 0, 0, 1, 1}; !equalInts(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// rankedRun writes the traces of 4 ranks on 4 hosts in 2 sites (a: a1 a2,
// b: b1 b2) where ranks 0 and 2 (a1, b1) and ranks 1 and 3 (a2, b2)
// exchange 1 MiB each way over relayed connections, and ranks 0 and 1
// exchange 1 KiB on the LAN: the best placement pairs 0 with 2.
func rankedRun(t *testing.T, ranks [4]int32) string {
	dir := t.TempDir()
	f := []*fileBuilder{newFile("a1", 10, 1, "a"), newFile("a2", 11, 1, "a"), newFile("b1", 20, 2, "b"), newFile("b2", 21, 2, "b")}
	addr := []string{"10.1.0.1", "10.1.0.2", "10.2.0.1", "10.2.0.2"}
	for i := range f {
		f[i].h.Rank = ranks[i]
	}
	pair := func(a, b int, fd int32, port string, size int64, n int, flags uint16) {
		la, lb := addr[a]+":4"+port, addr[b]+":5"+port
		f[a].conn(0, fd, FnConnect, la, lb, flags, 0)
		f[b].conn(time.Millisecond, fd, FnAccept, lb, la, flags, 0)
		f[a].writes(2*time.Millisecond, fd, n, time.Millisecond, size)
		f[b].writes(3*time.Millisecond, fd, n, time.Millisecond, size)
	}
	pair(0, 2, 5, "000", 64<<10, 16, FlagRelayed)
	pair(1, 3, 5, "001", 64<<10, 16, FlagRelayed)
	pair(0, 1, 6, "002", 128, 8, 0)
	pair(2, 3, 6, "003", 128, 8, 0)
	for _, x := range f {
		x.save(t, dir)
	}
	return dir
}

func TestAdvise(t *testing.T) {
	tr, err := Load(rankedRun(t, [4]int32{0, 1, 2, 3}), nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewRankGraph(tr)
	if err != nil {
		t.Fatal(err)
	}
	if g.Bytes[0][2] != 1<<20 || g.Msgs[2][0] != 16 || g.Bytes[0][1] != 1024 || g.Unmatched != 0 {
		t.Fatalf("graph: 0->2 %d B, 2->0 %d msgs, 0->1 %d B, unmatched %d", g.Bytes[0][2], g.Msgs[2][0], g.Bytes[0][1], g.Unmatched)
	}
	a := Advise(g)
	if a.WANBytesBefore != 4<<20 || a.WANBytesAfter != 4*1024 || a.WANMsgsBefore != 64 || a.WANMsgsAfter != 32 || a.Moved != 2 {
		t.Errorf("advice: bytes %d -> %d, msgs %d -> %d, %d moved", a.WANBytesBefore, a.WANBytesAfter, a.WANMsgsBefore, a.WANMsgsAfter, a.Moved)
	}
	// Ranks 0 and 2 share a site, 1 and 3 the other; each host keeps one rank.
	if a.Site[0] != a.Site[2] || a.Site[1] != a.Site[3] || a.Site[0] == a.Site[1] {
		t.Errorf("sites %v", a.Site)
	}
	var mf, rf strings.Builder
	a.WriteHostFile(&mf, FormatMachinefile)
	a.WriteHostFile(&rf, FormatRankfile)
	seen := map[string]bool{}
	for _, h := range strings.Fields(mf.String()) {
		if seen[h] {
			t.Errorf("host %s given two ranks:\n%s", h, mf.String())
		}
		seen[h] = true
	}
	if len(seen) != 4 || !strings.Contains(rf.String(), "rank 0="+a.Host[0]+" slot=0\n") {
		t.Errorf("machinefile:\n%srankfile:\n%s", mf.String(), rf.String())
	}
	for r := range a.Host { // a rank that stays in its site keeps its host
		if a.Site[r] == a.CurrentSite[r] && a.Host[r] != a.CurrentHost[r] {
			t.Errorf("rank %d stays in %s but moves from %s to %s", r, a.Site[r], a.CurrentHost[r], a.Host[r])
		}
		if a.Host[r][:1] != a.Site[r] {
			t.Errorf("rank %d placed on %s outside its site %s", r, a.Host[r], a.Site[r])
		}
	}
	var text strings.Builder
	a.WriteText(&text)
	if !strings.Contains(text.String(), "-99.9 %") || !strings.Contains(text.String(), "-50.0 %") {
		t.Errorf("summary lacks the reductions:\n%s", text.String())
	}
	if err := a.WriteHostFile(&mf, "hosts"); err == nil || !strings.Contains(err.Error(), "machinefile or rankfile") {
		t.Errorf("bad format: %v", err)
	}
}

func TestRankGraphErrors(t *testing.T) {
	for _, c := range []struct {
		ranks [4]int32
		want  string
	}{
		{[4]int32{-1, -1, -1, -1}, "no trace records an MPI rank"},
		{[4]int32{0, 1, 1, 3}, "rank 1 is claimed by both"},
		{[4]int32{0, 1, 2, 4}, "no trace of rank 3"},
	} {
		tr, err := Load(rankedRun(t, c.ranks), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := NewRankGraph(tr); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ranks %v: want error %q, got %v", c.ranks, c.want, err)
		}
	}
}
