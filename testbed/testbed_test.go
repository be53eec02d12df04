package testbed

import (
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/sitemap"
)

func TestParseRate(t *testing.T) {
	good := map[string]uint64{
		"200mbit": 200e6, "1gbit": 1e9, "500kbit": 500e3, "1000000": 1e6, "100mbps": 800e6,
		"2.5Gbit": 2.5e9, "0": 0, "unlimited": 0, "10m": 10e6,
	}
	for in, want := range good {
		got, err := ParseRate("wan-rate", in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "fast", "-1mbit", "10xbit", "1bit", "NaN", "1000gbit"} {
		_, err := ParseRate("wan-rate", in)
		if err == nil || !strings.Contains(err.Error(), "--wan-rate") {
			t.Errorf("ParseRate(%q): want error naming --wan-rate, got %v", in, err)
		}
	}
}

func TestParseLoss(t *testing.T) {
	for in, want := range map[string]float64{"0.1%": 0.001, "1%": 0.01, "0.01": 0.01, "0": 0, "100%": 1} {
		got, err := ParseLoss(in)
		if err != nil || math.Abs(got-want) > 1e-12 {
			t.Errorf("ParseLoss(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"x", "-1%", "101%", "2"} {
		if _, err := ParseLoss(in); err == nil || !strings.Contains(err.Error(), "--loss") {
			t.Errorf("ParseLoss(%q): want error naming --loss, got %v", in, err)
		}
	}
}

func TestParseQueue(t *testing.T) {
	// 200 Mbit/s x 20 ms = 500 000 bytes.
	q, err := ParseQueue("1bdp", 200e6, 20*time.Millisecond, 1500)
	if err != nil || q != 500000 {
		t.Errorf("1bdp = %d, %v", q, err)
	}
	q, err = ParseQueue("0.5bdp", 200e6, 20*time.Millisecond, 1500)
	if err != nil || q != 250000 {
		t.Errorf("0.5bdp = %d, %v", q, err)
	}
	for in, want := range map[string]int{"256k": 256 << 10, "1m": 1 << 20, "65536": 65536, "": 0} {
		q, err := ParseQueue(in, 0, 0, 1500)
		if err != nil || q != want {
			t.Errorf("ParseQueue(%q) = %d, %v; want %d", in, q, err, want)
		}
	}
	for _, in := range []string{"big", "-5", "0bdp", "2gb"} {
		if _, err := ParseQueue(in, 200e6, time.Millisecond, 1500); err == nil || !strings.Contains(err.Error(), "--queue") {
			t.Errorf("ParseQueue(%q): want error naming --queue, got %v", in, err)
		}
	}
	if q, err := ParseQueue("1bdp", 0, time.Millisecond, 1500); err != nil || q != 0 {
		t.Errorf("1bdp with unlimited rate = %d, %v; want the default (0)", q, err)
	}
	// Zero RTT must not give a queue that drops everything.
	if q := BDPQueue(100e6, 0, 1500); q < minQueueFloor {
		t.Errorf("BDPQueue with zero RTT = %d", q)
	}
}

func TestParseSites(t *testing.T) {
	s, err := ParseSites("3")
	if err != nil || strings.Join(s, ",") != "site1,site2,site3" {
		t.Errorf("3 -> %v, %v", s, err)
	}
	s, err = ParseSites("lyon,rennes")
	if err != nil || strings.Join(s, ",") != "lyon,rennes" {
		t.Errorf("lyon,rennes -> %v, %v", s, err)
	}
	for _, in := range []string{"1", "lyon", "Lyon,rennes", "a.b,c", "lyon,,rennes", "0"} {
		if _, err := ParseSites(in); err == nil || !strings.Contains(err.Error(), "--sites") {
			t.Errorf("ParseSites(%q): want error naming --sites, got %v", in, err)
		}
	}
}

func TestNormalize(t *testing.T) {
	c := Config{}
	if err := c.Normalize(); err != nil {
		t.Fatal(err)
	}
	if c.Name != "mpi5k" || len(c.Sites) != 2 || c.Nodes != 2 || c.MTU != 1500 || c.GatewayNICs != 1 || c.Gateways != 1 || c.HostCC != "" {
		t.Errorf("defaults: %+v", c)
	}
	if c := (Config{HostCC: "system"}); c.Normalize() != nil || c.HostCC != "" {
		t.Errorf("host-cc system must mean the machine's default: %+v", c)
	}
	if c := (Config{SiteLANReorder: map[string]float64{"site2": 0.01}}); c.Normalize() != nil || c.LANReorderDelay != DefaultReorderDelay {
		t.Errorf("LAN reorder without a delay must take the default delay: %+v", c)
	}
	if c := (Config{Reorder: 0.01}); c.Normalize() != nil || c.ReorderDelay != DefaultReorderDelay {
		t.Errorf("reorder without a delay must take the default delay: %+v", c)
	}
	if c := (Config{Reorder: 0.01, ReorderDelay: time.Millisecond}); c.Normalize() != nil || c.ReorderDelay != time.Millisecond {
		t.Errorf("reorder delay given: %+v", c)
	}
	bad := []struct {
		c    Config
		want string
	}{
		{Config{Name: "a.b"}, "name"},
		{Config{Sites: []string{"a", "a"}}, "sites"},
		{Config{Nodes: -1}, "nodes"},
		{Config{Loss: 2}, "loss"},
		{Config{MTU: 100}, "mtu"},
		{Config{GatewayNICs: 3}, "gateway-nics"},
		{Config{Gateways: -1}, "gateways: need 1..8"},
		{Config{Gateways: MaxGateways + 1}, "gateways: need 1..8"},
		{Config{Queue: 100}, "queue"},
		{Config{RTT: -time.Second}, "rtt"},
		{Config{HostCC: "Cubic;rm"}, "host-cc"},
		{Config{Reorder: 1.5}, "reorder: 1.5 out of range"},
		{Config{Reorder: -0.1}, "reorder: -0.1 out of range"},
		{Config{Reorder: 0.01, ReorderDelay: 2 * time.Second}, "reorder-delay: 2s out of range"},
		{Config{ReorderDelay: time.Millisecond}, "reorder-delay: 1ms given without reorder"},
		{Config{Sites: []string{"a", "b"}, Pairs: []PairLink{{A: "a", B: "b", Reorder: 2}}}, "pairs: a-b reorder: 2 out of range"},
		{Config{LANLoss: 1.1}, "lan-loss: 1.1 out of range"},
		{Config{SiteLANLoss: map[string]float64{"site3": 0.1}}, `lan-loss: site "site3" is not one of the lab's sites`},
		{Config{SiteLANLoss: map[string]float64{"site2": -1}}, "lan-loss: site2=-1 out of range"},
		{Config{LANReorder: 2}, "lan-reorder: 2 out of range"},
		{Config{SiteLANReorder: map[string]float64{"x": 0.1}}, `lan-reorder: site "x" is not one of the lab's sites`},
		{Config{LANReorderDelay: time.Millisecond}, "lan-reorder-delay: 1ms given without lan-reorder"},
		{Config{LANReorder: 0.1, LANReorderDelay: 2 * time.Second}, "lan-reorder-delay: 2s out of range"},
	}
	for _, b := range bad {
		if err := b.c.Normalize(); err == nil || !strings.HasPrefix(err.Error(), b.want) {
			t.Errorf("%+v: want error starting %q, got %v", b.c, b.want, err)
		}
	}
}

func TestPlanAndSiteMap(t *testing.T) {
	for _, nics := range []int{1, 2} {
		c := Config{Name: "t", Sites: []string{"lyon", "rennes", "nancy"}, Nodes: 3, GatewayNICs: nics}
		if err := c.Normalize(); err != nil {
			t.Fatal(err)
		}
		hs := planHosts(&c)
		if len(hs) != 3*(3+1+extraHosts) {
			t.Fatalf("%d hosts", len(hs))
		}
		text := siteMap(&c, hs)
		m, err := sitemap.Parse(strings.NewReader(text), "sites.conf")
		if err != nil {
			t.Fatalf("site map does not parse: %v\n%s", err, text)
		}
		rennes, ok := m.Site("rennes")
		if !ok || rennes.ID != 2 || rennes.LAN != netip.MustParseAddrPort("10.77.2.2:5000") {
			t.Errorf("rennes: %+v", rennes)
		}
		wantWAN := "10.77.2.2:5001"
		if nics == 2 {
			wantWAN = "10.78.2.2:5001"
		}
		if rennes.WAN.String() != wantWAN {
			t.Errorf("rennes WAN %v, want %s", rennes.WAN, wantWAN)
		}
		s, ok := m.Lookup(netip.MustParseAddr("10.77.3.12"))
		if !ok || s.Name != "nancy" {
			t.Errorf("10.77.3.12 in %v", s)
		}
		for _, h := range hs {
			if _, ok := m.Host(h.Name); !ok {
				t.Errorf("host %s missing from site map", h.Name)
			}
			if !strings.Contains(hostsFile(&c, hs), h.LAN.String()+"\t"+h.Name+"\n") {
				t.Errorf("host %s missing from hosts file", h.Name)
			}
		}
	}
	if g := gatewaysEnv([]string{"site1", "site2"}, 1); g != "site1=gw.site1,site2=gw.site2" {
		t.Errorf("gatewaysEnv = %q", g)
	}
}

// TestPlanSeveralGateways: lab up --gateways 3 gives each site gw, gw2 and
// gw3 on its LAN (.2, .3, .4) and WAN legs, each with router ports of its
// own; the site map lists the first in the site record and the others as
// gateway records; MPI5K_GATEWAYS names all three per site; a state saved
// before the field (Gateways 0) plans one gateway.
func TestPlanSeveralGateways(t *testing.T) {
	c := Config{Name: "t", Sites: []string{"lyon", "rennes"}, Nodes: 2, GatewayNICs: 2, Gateways: 3}
	if err := c.Normalize(); err != nil {
		t.Fatal(err)
	}
	hs := planHosts(&c)
	var gws []string
	ports := map[string]bool{}
	for _, h := range hs {
		for _, p := range []string{h.RtrPort, h.RtrWAN} {
			if p != "" && ports[p] {
				t.Errorf("router port %s given twice", p)
			}
			ports[p] = true
		}
		if h.Kind == kindGateway && h.Site == "rennes" {
			gws = append(gws, fmt.Sprintf("%s %s %s %s %s", h.Name, h.LAN, h.WAN, h.RtrPort, h.RtrWAN))
		}
	}
	want := []string{"gw.rennes 10.77.2.2 10.78.2.2 v2g w2g", "gw2.rennes 10.77.2.3 10.78.2.3 v2g2 w2g2", "gw3.rennes 10.77.2.4 10.78.2.4 v2g3 w2g3"}
	if !slices.Equal(gws, want) {
		t.Errorf("gateways of rennes:\n%q\nwant\n%q", gws, want)
	}
	text := siteMap(&c, hs)
	m, err := sitemap.Parse(strings.NewReader(text), "sites.conf")
	if err != nil {
		t.Fatalf("site map does not parse: %v\n%s", err, text)
	}
	rennes, _ := m.Site("rennes")
	var got []string
	for _, g := range rennes.Gateways {
		got = append(got, g.LAN.String()+" "+g.WAN.String())
	}
	if want := []string{"10.77.2.2:5000 10.78.2.2:5001", "10.77.2.3:5000 10.78.2.3:5001", "10.77.2.4:5000 10.78.2.4:5001"}; !slices.Equal(got, want) {
		t.Errorf("site map gateways of rennes %q, want %q\n%s", got, want, text)
	}
	hf := hostsFile(&c, hs)
	for _, line := range []string{"10.77.2.3\tgw2.rennes\n", "10.78.2.3\tgw2-wan.rennes\n", "10.78.1.4\tgw3-wan.lyon\n"} {
		if !strings.Contains(hf, line) {
			t.Errorf("hosts file lacks %q:\n%s", line, hf)
		}
	}
	if g := gatewaysEnv(c.Sites, c.Gateways); g != "lyon=gw.lyon,gw2.lyon,gw3.lyon,rennes=gw.rennes,gw2.rennes,gw3.rennes" {
		t.Errorf("gatewaysEnv = %q", g)
	}
	old := Config{Name: "t", Sites: []string{"a", "b"}, Nodes: 1}
	n := 0
	for _, h := range planHosts(&old) {
		if h.Kind == kindGateway {
			n++
		}
	}
	if n != 2 {
		t.Errorf("a config without Gateways plans %d gateway hosts, want 2 (one per site)", n)
	}
}

func TestShaperRateAndQueue(t *testing.T) {
	// 100 Mbit/s: a 1250-byte packet takes 100 µs.
	s := shaper{rate: 100e6, queue: 5000}
	var now int64 = 1e9
	dep, wait, ok := s.admit(now, 1250)
	if !ok || wait != 0 || dep != now+100e3 {
		t.Fatalf("first packet: dep %d wait %d ok %v", dep-now, wait, ok)
	}
	// A burst arriving at the same instant queues behind it. The backlog
	// counts the bytes not yet serialized, the packet on the wire included:
	// 3 more fit (backlog 2500..5000 bytes), the next is dropped.
	accepted := 1
	for i := 0; i < 10; i++ {
		if _, _, ok := s.admit(now, 1250); ok {
			accepted++
		}
	}
	if accepted != 4 {
		t.Errorf("accepted %d packets of a burst into a 5000-byte queue, want 4", accepted)
	}
	// Once the queue drained, packets pass again without waiting.
	dep, wait, ok = s.admit(now+1e6, 1250)
	if !ok || wait != 0 || dep != now+1e6+100e3 {
		t.Errorf("after drain: dep %d wait %d ok %v", dep-now, wait, ok)
	}
	// Long-run rate: packets offered at twice the rate leave at the rate.
	s = shaper{rate: 100e6, queue: 1 << 20}
	var last int64
	for i := 0; i < 1000; i++ {
		d, _, ok := s.admit(int64(i)*50e3, 1250)
		if ok {
			last = d
		}
	}
	if last != 1000*100e3 {
		t.Errorf("1000 packets left at %d ns, want %d", last, int64(1000*100e3))
	}
	// Unlimited rate never queues.
	u := shaper{}
	if d, w, ok := u.admit(7, 9000); !ok || d != 7 || w != 0 {
		t.Errorf("unlimited: %d %d %v", d, w, ok)
	}
}

func TestDelivererJitterNeverReorders(t *testing.T) {
	d := deliverer{rng: 12345}
	var prev int64
	var sum float64
	const n = 100000
	for i := 0; i < n; i++ {
		dep := int64(i) * 1e6 // 1 ms apart: jitter 0.2 ms never needs clamping
		at := d.at(dep, 10e6, 200e3)
		if at < prev || at < dep {
			t.Fatalf("packet %d delivered at %d before %d", i, at, prev)
		}
		off := at - dep - 10e6
		if off < -200e3 || off > 200e3 {
			t.Fatalf("jitter %d outside +-200us", off)
		}
		sum += float64(off)
		prev = at
	}
	if mean := sum / n; math.Abs(mean) > 5e3 {
		t.Errorf("mean jitter %v ns, want ~0", mean)
	}
	// Back-to-back packets with jitter stay in order.
	d = deliverer{rng: 99}
	prev = 0
	for i := 0; i < 1000; i++ {
		at := d.at(int64(i)*1000, 1e6, 500e3)
		if at < prev {
			t.Fatalf("reordered at %d", i)
		}
		prev = at
	}
}

func TestHistogramPercentiles(t *testing.T) {
	var h histogram
	for us := 1; us <= 10000; us++ {
		h.add(time.Duration(us) * time.Microsecond)
	}
	p := h.percentiles()
	check := func(name string, got time.Duration, want float64) {
		g := float64(got / time.Microsecond)
		if g < want || g > want*1.07 {
			t.Errorf("%s = %v, want %v us (+7%%)", name, got, want)
		}
	}
	check("p50", p.P50, 5000)
	check("p90", p.P90, 9000)
	check("p99", p.P99, 9900)
	check("max", p.Max, 10000)
	if p.Count != 10000 {
		t.Errorf("count %d", p.Count)
	}
	for i := 0; i < histBuckets-1; i++ {
		if histIndex(histUpper(i)) != i || histIndex(histUpper(i)+1) != i+1 {
			t.Fatalf("bucket %d bounds inconsistent", i)
		}
	}
}

func TestHistogramOver(t *testing.T) {
	var h histogram
	for _, d := range []time.Duration{0, 30 * time.Microsecond, 900 * time.Millisecond, 1100 * time.Millisecond, 142 * time.Second} {
		h.add(d)
	}
	for _, c := range []struct {
		d    time.Duration
		want uint64
	}{{0, 5}, {time.Microsecond, 4}, {time.Second, 2}, {100 * time.Second, 1}, {time.Hour, 0}} {
		if got := h.over(c.d); got != c.want {
			t.Errorf("over(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

func TestRetransmissionDetection(t *testing.T) {
	var f flowState
	seq := uint32(math.MaxUint32 - 3000) // wraps during the test
	if f.observeTCP(seq, 0, true, false) {
		t.Fatal("SYN counted as retransmission")
	}
	seq++
	for i := 0; i < 5; i++ {
		if f.observeTCP(seq+uint32(i*1448), 1448, false, false) {
			t.Fatalf("new segment %d counted as retransmission", i)
		}
	}
	if f.observeTCP(seq+1448, 1448, false, false) != true {
		t.Error("repeated segment not counted")
	}
	if f.observeTCP(seq+5*1448, 0, false, false) {
		t.Error("pure ACK counted")
	}
	if f.observeTCP(seq+4*1448+100, 1448, false, false) != true {
		t.Error("partial overlap not counted")
	}
	if f.observeTCP(seq+6*1448, 1448, false, false) {
		t.Error("segment after a gap counted")
	}
	if f.retrans != 2 {
		t.Errorf("retrans = %d, want 2", f.retrans)
	}
}

func TestParseSSHArgs(t *testing.T) {
	cases := []struct {
		args       []string
		host, cmd  string
		shouldFail bool
	}{
		{[]string{"-x", "node-1.site2", "orted", "-mca", "x"}, "node-1.site2", "orted -mca x", false},
		{[]string{"-x", "-o", "BatchMode=yes", "-p", "22", "root@gw.site1", "echo", "hi"}, "gw.site1", "echo hi", false},
		{[]string{"-oStrictHostKeyChecking=no", "-xT", "node-2.site1", "sh -c 'a; b'"}, "node-2.site1", "sh -c 'a; b'", false},
		{[]string{"-l", "root", "-n", "node-1.lyon", "true"}, "node-1.lyon", "true", false},
		{[]string{"-x"}, "", "", true},
		{[]string{"-Z", "h", "c"}, "", "", true},
		{[]string{"-p"}, "", "", true},
	}
	for _, c := range cases {
		h, cmd, err := ParseSSHArgs(c.args)
		if (err != nil) != c.shouldFail || h != c.host || cmd != c.cmd {
			t.Errorf("ParseSSHArgs(%q) = %q, %q, %v", c.args, h, cmd, err)
		}
	}
}

func TestICMPChecksum(t *testing.T) {
	msg := []byte{8, 0, 0, 0, 0x12, 0x34, 0, 1, 'a', 'b', 'c'}
	c := icmpChecksum(msg)
	msg[2], msg[3] = byte(c>>8), byte(c)
	if icmpChecksum(msg) != 0 {
		t.Error("checksum of a checksummed message is not 0")
	}
}

// udpPacket builds a minimal IPv4/UDP packet of n bytes (checksums unused
// by the emulator).
func udpPacket(n int, sport uint16) []byte {
	b := make([]byte, n)
	b[0] = 0x45
	b[2], b[3] = byte(n>>8), byte(n)
	b[8] = 64
	b[9] = 17
	copy(b[12:16], []byte{10, 77, 1, 11})
	copy(b[16:20], []byte{10, 77, 2, 11})
	b[20], b[21] = byte(sport>>8), byte(sport)
	b[22], b[23] = 0x1b, 0x58 // port 7000
	ul := n - 20
	b[24], b[25] = byte(ul>>8), byte(ul)
	return b
}

func TestParseLANLoss(t *testing.T) {
	for _, c := range []struct {
		in   string
		all  float64
		per  map[string]float64
		fail string
	}{
		{in: "0"},
		{in: "1%", all: 0.01},
		{in: "site1=2%", per: map[string]float64{"site1": 0.02}},
		{in: "0.1%, site2=0.05", all: 0.001, per: map[string]float64{"site2": 0.05}},
		{in: "1%,2%", fail: "every-site value twice"},
		{in: "site1=1%,site1=2%", fail: "site site1 given twice"},
		{in: "Site1=1%", fail: `bad site name "Site1"`},
		{in: "site1=", fail: `--lan-loss: bad value "" (examples`},
		{in: "site1=120%", fail: `--lan-loss: "120%" out of range 0..100% (site site1)`},
		{in: "lots", fail: `--lan-loss: bad value "lots"`},
	} {
		all, per, err := ParseLANLoss(c.in)
		if c.fail != "" {
			if err == nil || !strings.Contains(err.Error(), c.fail) {
				t.Errorf("%q: want error containing %q, got %v", c.in, c.fail, err)
			}
			continue
		}
		if err != nil || all != c.all || !maps.Equal(per, c.per) {
			t.Errorf("%q: got %v %v %v, want %v %v", c.in, all, per, err, c.all, c.per)
		}
	}
}

// The LAN loss rules charge each lossy site's ports, and only them, at
// the configured probability; a lab without LAN loss has no rules.
func TestLANLossScript(t *testing.T) {
	c := Config{Sites: []string{"a", "b", "c"}, Nodes: 1, LANLoss: 0.001, SiteLANLoss: map[string]float64{"b": 0.025, "c": 0}}
	if err := c.Normalize(); err != nil {
		t.Fatal(err)
	}
	s := lanLossScript(&c, planHosts(&c))
	for _, want := range []string{
		`iifname { "v1n1", "v1g", "v1x1" } counter name "lan1_frames" numgen random mod 1000000 < 1000 counter name "lan1_drops" drop`,
		`oifname { "v1n1", "v1g", "v1x1" } counter name "lan1_frames" numgen random mod 1000000 < 1000 counter name "lan1_drops" drop`,
		`iifname { "v2n1", "v2g", "v2x1" } counter name "lan2_frames" numgen random mod 1000000 < 25000 counter name "lan2_drops" drop`,
		"type filter hook prerouting priority -10", "type filter hook output priority -10",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "v3") || strings.Contains(s, "lan3") || strings.Contains(s, "netdev") {
		t.Errorf("site c has no LAN loss and no site reorders, but the script names them:\n%s", s)
	}
	// Reordering on site c alone: its ports divert IPv4 to its TUN.
	c.SiteLANReorder = map[string]float64{"c": 0.02}
	if err := c.Normalize(); err != nil {
		t.Fatal(err)
	}
	s = lanLossScript(&c, planHosts(&c))
	want := "\tchain hold3 {\n\t\ttype filter hook ingress devices = { \"v3n1\", \"v3g\", \"v3x1\" } priority -10; policy accept;\n" +
		"\t\tmeta protocol ip numgen random mod 1000000 < 20000 counter name \"lan3_held\" fwd to \"l3\"\n\t}\n"
	if !strings.Contains(s, "table netdev mpi5k_lanq {") || !strings.Contains(s, want) || strings.Contains(s, "hold1") || strings.Contains(s, "hold2") {
		t.Errorf("reordering on site c, script:\n%s", s)
	}
	c.SiteLANReorder = nil
	c.LANLoss, c.SiteLANLoss = 0, nil
	if s := lanLossScript(&c, planHosts(&c)); s != "" {
		t.Errorf("no LAN loss, script:\n%s", s)
	}
}
