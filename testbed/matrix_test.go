package testbed

import (
	"strings"
	"testing"
	"time"
)

func TestParseMatrix(t *testing.T) {
	def := PairLink{RTT: 20 * time.Millisecond, Rate: 200e6}
	text := `# comment
sites a b c
default rtt=10ms rate=100mbit   # unlisted pairs
a b rtt=4ms loss=0.1% reorder=2%
c a rate=1gbit jitter=0.5ms queue=256k
`
	m, err := ParseMatrix("m.txt", strings.NewReader(text), def)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(m.Sites, ",") != "a,b,c" || len(m.Pairs) != 3 {
		t.Fatalf("sites %v, %d pairs", m.Sites, len(m.Pairs))
	}
	c := Config{Sites: m.Sites, Pairs: m.Pairs, RTT: time.Second}
	if err := c.Normalize(); err != nil {
		t.Fatal(err)
	}
	want := map[[2]string]PairLink{
		{"a", "b"}: {RTT: 4 * time.Millisecond, Rate: 100e6, Loss: 0.001, Queue: minQueueFloor, Reorder: 0.02, ReorderDelay: DefaultReorderDelay},
		{"b", "a"}: {RTT: 4 * time.Millisecond, Rate: 100e6, Loss: 0.001, Queue: minQueueFloor, Reorder: 0.02, ReorderDelay: DefaultReorderDelay},
		{"a", "c"}: {RTT: 10 * time.Millisecond, Rate: 1e9, Jitter: 500 * time.Microsecond, Queue: 256 << 10},
		{"b", "c"}: {RTT: 10 * time.Millisecond, Rate: 100e6, Queue: BDPQueue(100e6, 10*time.Millisecond, 1500)},
	}
	for k, w := range want {
		got := c.Pair(k[0], k[1])
		got.A, got.B = "", ""
		if got != w {
			t.Errorf("pair %v: got %+v, want %+v", k, got, w)
		}
	}
	if c.MaxRTT() != time.Second {
		t.Errorf("MaxRTT %v: the lab-wide RTT counts too", c.MaxRTT())
	}

	// Without `sites` and `default`: sites in order of mention, the flags'
	// values for pairs left out.
	m, err = ParseMatrix("m", strings.NewReader("x y rtt=3ms\ny z\n"), def)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(m.Sites, ",") != "x,y,z" {
		t.Errorf("sites %v", m.Sites)
	}
	for _, p := range m.Pairs {
		wantRTT := def.RTT
		if p.A == "x" && p.B == "y" {
			wantRTT = 3 * time.Millisecond
		}
		if p.RTT != wantRTT || p.Rate != def.Rate {
			t.Errorf("%+v: want rtt %v rate %d", p, wantRTT, def.Rate)
		}
	}
}

func TestParseMatrixErrors(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"a b rtt=4\n", "f:1: rtt=4: want a duration"},
		{"a b rtt=4ms\n\nb a rtt=5ms\n", "f:3: pair b a already given on line 1"},
		{"a a rtt=1ms\n", "f:1: pair a a joins a site to itself"},
		{"sites a b\na c\n", `f:2: site "c" is not on the ` + "`sites`" + ` line`},
		{"a b speed=1\n", `f:1: unknown key "speed"`},
		{"a b rate=fast\n", "f:1: rate=fast:"},
		{"a b loss=200%\n", "f:1: loss=200%: want 0..100%"},
		{"a b rtt\n", `f:1: "rtt" is not key=value`},
		{"a b rtt=1ms rtt=2ms\n", "f:1: rtt given twice"},
		{"a rtt=1ms\n", "f:1: want `SITE SITE key=value...`"},
		{"A b\n", `f:1: bad site name "A"`},
		{"a b\ndefault rtt=1ms\n", "f:2: `default` must come before"},
		{"default rtt=1ms\ndefault rtt=2ms\n", "f:2: second `default` line (the first is line 1"},
		{"a b\nsites a b\n", "f:2: `sites` must come before"},
		{"sites a\n", "f:1: `sites` needs at least 2"},
		{"# nothing\n", "f: names fewer than 2 sites"},
		{"a b queue=lots\n", "f:1: queue=lots"},
		{"a b reorder=2\n", "f:1: reorder=2: want 0..100%"},
		{"a b reorder=1% reorder-delay=5\n", "f:1: reorder-delay=5: want a duration"},
		{"a b reorder-delay=2s\n", "f:1: reorder-delay=2s: want a duration"},
	} {
		_, err := ParseMatrix("f", strings.NewReader(c.text), PairLink{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: want error containing %q, got %v", c.text, c.want, err)
		}
	}
	// A delay without a fraction is caught when the lab is normalized.
	m, err := ParseMatrix("f", strings.NewReader("a b reorder-delay=3ms\n"), PairLink{})
	if err != nil {
		t.Fatal(err)
	}
	c := Config{Sites: m.Sites, Pairs: m.Pairs}
	if err := c.Normalize(); err == nil || !strings.Contains(err.Error(), "pairs: a-b reorder-delay: 3ms given without reorder") {
		t.Errorf("reorder-delay without reorder: %v", err)
	}
	bad := Config{Sites: []string{"a", "b"}, Pairs: []PairLink{{A: "a", B: "z"}}}
	if err := bad.Normalize(); err == nil || !strings.HasPrefix(err.Error(), "pairs:") {
		t.Errorf("pair naming an unknown site: %v", err)
	}
}

// The example matrix parses, names 8 sites and every pair explicitly.
func TestExampleMatrix(t *testing.T) {
	m, err := ParseMatrixFile("examples/grid5000-8sites.matrix", PairLink{RTT: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := Config{Sites: m.Sites, Pairs: m.Pairs}
	if err := c.Normalize(); err != nil {
		t.Fatal(err)
	}
	if len(c.Sites) != 8 || len(c.Pairs) != 28 {
		t.Fatalf("%d sites, %d pairs", len(c.Sites), len(c.Pairs))
	}
	if p := c.Pair("lyon", "grenoble"); p.RTT != 3*time.Millisecond || p.Rate != 200e6 {
		t.Errorf("lyon-grenoble %+v", p)
	}
	if p := c.Pair("sophia", "luxembourg"); p.RTT != 24*time.Millisecond || p.Rate != 100e6 || p.Loss != 0.0001 {
		t.Errorf("sophia-luxembourg %+v", p)
	}
	if c.MaxRTT() != 24*time.Millisecond {
		t.Errorf("MaxRTT %v, want sophia-luxembourg's 24ms", c.MaxRTT())
	}
}
