package gateway

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/mpi5k/mpi5k/tuning"
	"github.com/spf13/pflag"
)

func parseFlags(t *testing.T, remote bool, args ...string) *Flags {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	f := NewFlags(fs, remote)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return f
}

// onCC makes hostCC read cc until the test ends.
func onCC(t *testing.T, cc string) {
	f := hostCC
	t.Cleanup(func() { hostCC = f })
	hostCC = func() (string, error) { return cc, nil }
}

// No flag: --wan-trunk auto, which on a CUBIC host is DefaultConfig with
// the parallel preset beside it and on a BBR host the other way round,
// and nothing to pass on.
func TestFlagsDefaults(t *testing.T) {
	parallel := DefaultConfig()
	applyTrunk(&parallel, TrunkParallel, func(string) bool { return false })
	for cc, want := range map[string]struct{ mine, alt Config }{"cubic": {DefaultConfig(), parallel}, "bbr": {parallel, DefaultConfig()}} {
		onCC(t, cc)
		f := parseFlags(t, false)
		c, err := f.Config()
		if err != nil {
			t.Fatal(err)
		}
		w := want.mine
		w.TrunkCC, w.TrunkAlt = cc, &want.alt
		if !reflect.DeepEqual(c, w) {
			t.Errorf("flag defaults on a %s host\n%+v\nwant\n%+v", cc, c, w)
		}
		if a := f.Args(); len(a) != 0 {
			t.Errorf("Args without flags: %q", a)
		}
	}
}

// What `mpi5k run` renders, a gateway parses back into the same Config;
// only the flags given are rendered.
func TestFlagsRoundTrip(t *testing.T) {
	in := []string{"--wan-conns", "3", "--window", "8MiB", "--wan-pace", "190mbit", "--chunk=64KiB", "--express-max", "16KiB",
		"--wan-express-renew=false", "--poll-thread=false", "--wan-queue", "2ms", "--wan-rto-min", "0", "--lan-sndbuf", "1MiB"}
	run := parseFlags(t, true, in...)
	want, err := run.Config()
	if err != nil {
		t.Fatal(err)
	}
	args := run.Args()
	if got := strings.Join(args, " "); got != "--wan-conns=3 --window=8MiB --wan-pace=190mbit --lan-sndbuf=1MiB --chunk=64KiB "+
		"--wan-express-renew=false --express-max=16KiB --wan-queue=2ms --wan-rto-min=0s --poll-thread=false" {
		t.Errorf("Args: %s", got)
	}
	onCC(t, "cubic")
	got, err := parseFlags(t, false, args...).Config()
	if err != nil {
		t.Fatal(err)
	}
	if got.Trunk != TrunkShared || got.TrunkCC != "cubic" || got.TrunkAlt == nil || got.TrunkAlt.WANConns != 3 {
		t.Errorf("gateway on a CUBIC host: trunk %q by %q, alt %+v", got.Trunk, got.TrunkCC, got.TrunkAlt)
	}
	// The gateway resolves the default auto on its host.
	got.Trunk, got.TrunkCC, got.TrunkAlt = TrunkAuto, "", nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("gateway parsed\n%+v\nwant\n%+v", got, want)
	}
	if want.WANConns != 3 || want.Window != 8<<20 || want.WANPace != 190e6 || want.Chunk != 64<<10 || want.ExpressMax != 16<<10 ||
		want.Renew || want.PollThread || !want.Express || want.WANQueue.Milliseconds() != 2 || want.WAN.RTOMin != 0 || want.LAN.SndBuf != 1<<20 {
		t.Errorf("parsed %+v", want)
	}
}

// --wan-encrypt is on by default and stored negated: false gives an
// integrity-only Config, which `mpi5k run` passes on as it was given.
func TestFlagsWANEncrypt(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		integrity bool
		rendered  string
	}{
		{nil, false, ""},
		{[]string{"--wan-encrypt"}, false, "--wan-encrypt=true"},
		{[]string{"--wan-encrypt=false"}, true, "--wan-encrypt=false"},
		{[]string{"--wan-encrypt=0"}, true, "--wan-encrypt=false"},
	} {
		f := parseFlags(t, true, tc.args...)
		c, err := f.Config()
		if err != nil {
			t.Fatal(err)
		}
		if c.WANIntegrityOnly != tc.integrity || strings.Join(f.Args(), " ") != tc.rendered {
			t.Errorf("%q: integrity-only %v, Args %q; want %v, %q", tc.args, c.WANIntegrityOnly, f.Args(), tc.integrity, tc.rendered)
		}
		if back, err := parseFlags(t, false, f.Args()...).Config(); err != nil || back.WANIntegrityOnly != tc.integrity {
			t.Errorf("%q: rendered flags parse back to integrity-only %v (%v)", tc.args, back.WANIntegrityOnly, err)
		}
	}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	NewFlags(fs, false)
	if err := fs.Parse([]string{"--wan-encrypt=maybe"}); err == nil || !strings.Contains(err.Error(), `invalid argument "maybe" for "--wan-encrypt" flag: want true or false`) {
		t.Errorf("--wan-encrypt=maybe: %v", err)
	}
}

// Each value is refused as it is parsed, naming the flag and the input;
// settings that only clash together are refused by Config.
func TestFlagsRefuse(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--wan-conns", "64"}, `invalid argument "64" for "--wan-conns" flag: bulk WAN connections 64 out of range 1..63`},
		{[]string{"--window", "2GiB"}, `invalid argument "2GiB" for "--window" flag: size 2GiB out of range 1..1GiB`},
		{[]string{"--wan-queue", "soon"}, `invalid argument "soon" for "--wan-queue" flag: bad duration "soon"`},
		{[]string{"--wan-cc", "no-such-cc"}, `invalid argument "no-such-cc" for "--wan-cc" flag: congestion control "no-such-cc": not offered by this kernel`},
		{[]string{"--wan-prime=maybe"}, `invalid argument "maybe" for "--wan-prime" flag`},
	} {
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		NewFlags(fs, false)
		if err := fs.Parse(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--chunk", "32KiB", "--express-max", "64KiB"}, "--express-max 64KiB out of range 0..32KiB (the chunk, --chunk)"},
		{[]string{"--wan-delack-max", "1s"}, "--wan-delack-max 1s out of range 0..200ms"},
		{[]string{"--wan-pace", "20kbit", "--wan-conns", "4"}, "--wan-pace 20000 bit/s is below 8 kbit/s per WAN connection (4 connections)"},
	} {
		if _, err := parseFlags(t, true, tc.args...).Config(); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// The default express-max follows a smaller chunk instead of refusing it.
func TestFlagsSmallChunk(t *testing.T) {
	if _, err := parseFlags(t, false, "--chunk", "32KiB").Config(); err != nil {
		t.Error(err)
	}
}

// A remote gateway's kernel decides which congestion controls exist: the
// wrapper refuses only names Linux does not have.
func TestCheckCCName(t *testing.T) {
	for cc, ok := range map[string]bool{"": true, "cubic": true, "bbr": true, "htcp": true, "bogus": false, "BBR": false} {
		if err := tuning.CheckCCName(cc); (err == nil) != ok {
			t.Errorf("tuning.CheckCCName(%q) = %v", cc, err)
		}
	}
}

// --wan-trunk parallel sets what its table names and nothing else; a
// flag given beside it keeps its value.
func TestFlagsTrunkParallel(t *testing.T) {
	c, err := parseFlags(t, false, "--wan-trunk", "parallel").Config()
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.Trunk, want.WANConns, want.Stripe, want.Express, want.Prime = TrunkParallel, parallelLinks, false, false, false
	want.WANQueue, want.ProbeRTTGuard, want.PollThread = 0, false, false
	if !reflect.DeepEqual(c, want) {
		t.Errorf("--wan-trunk parallel\n%+v\nwant\n%+v", c, want)
	}
	if c.WAN.RTOMin != DefaultConfig().WAN.RTOMin || c.WAN.DelackMax != DefaultConfig().WAN.DelackMax {
		t.Errorf("parallel changed the WAN timers: rto-min %v, delack-max %v", c.WAN.RTOMin, c.WAN.DelackMax)
	}
	c, err = parseFlags(t, false, "--wan-conns", "4", "--wan-trunk=parallel", "--wan-express").Config()
	if err != nil {
		t.Fatal(err)
	}
	if c.WANConns != 4 || !c.Express || c.Stripe || c.Trunk != TrunkParallel {
		t.Errorf("--wan-trunk parallel beside --wan-conns 4 --wan-express: conns %d, express %v, stripe %v, trunk %q", c.WANConns, c.Express, c.Stripe, c.Trunk)
	}
	// It is the flag set measured as tlst in bench/figures/competing.
	tlst, err := parseFlags(t, false, "--wan-trunk=shared", "--poll-thread=false", "--wan-express=false", "--wan-conns", "8", "--wan-stripe=false",
		"--wan-prime=false", "--wan-queue", "0", "--wan-skip-probe-rtt=false").Config()
	if err != nil {
		t.Fatal(err)
	}
	tlst.Trunk = TrunkParallel
	if !reflect.DeepEqual(tlst, want) {
		t.Errorf("--wan-trunk parallel is not the measured tlst flags\n%+v\nwant\n%+v", want, tlst)
	}
	// shared is DefaultConfig.
	if c, err := parseFlags(t, false, "--wan-trunk", "shared").Config(); err != nil || !reflect.DeepEqual(c, DefaultConfig()) {
		t.Errorf("--wan-trunk shared: %v\n%+v", err, c)
	}
}

// auto follows the host's default congestion control, says which it
// read, and refuses when it cannot read it; remote gateways resolve it on
// their own hosts.
func TestFlagsTrunkAuto(t *testing.T) {
	defer func(f func() (string, error)) { hostCC = f }(hostCC)
	for cc, preset := range map[string]string{"bbr": TrunkParallel, "cubic": TrunkShared, "reno": TrunkShared} {
		hostCC = func() (string, error) { return cc, nil }
		c, err := parseFlags(t, false, "--wan-trunk", "auto").Config()
		if err != nil {
			t.Fatal(err)
		}
		if c.Trunk != preset || c.TrunkCC != cc || (preset == TrunkParallel) != (c.WANConns == parallelLinks) {
			t.Errorf("auto on a %s host: trunk %q (by %q), %d links; want %s", cc, c.Trunk, c.TrunkCC, c.WANConns, preset)
		}
		// The other preset, for the site pairs that agree on it.
		if a := c.TrunkAlt; a == nil || a.Trunk != otherTrunk(preset) || (preset == TrunkShared) != (a.WANConns == parallelLinks) || a.TrunkAlt != nil {
			t.Errorf("auto on a %s host: the other preset %+v", cc, a)
		}
	}
	// Flags given win in both presets.
	hostCC = func() (string, error) { return "bbr", nil }
	if c, err := parseFlags(t, false, "--wan-trunk", "auto", "--wan-conns", "3").Config(); err != nil || c.WANConns != 3 || c.TrunkAlt == nil || c.TrunkAlt.WANConns != 3 || !c.TrunkAlt.Express {
		t.Errorf("auto with --wan-conns 3: %v, %+v", err, c)
	}
	hostCC = func() (string, error) { return "", nil }
	if _, err := parseFlags(t, false, "--wan-trunk", "auto").Config(); err == nil || !strings.Contains(err.Error(), "(it reads empty)") {
		t.Errorf("auto, empty: %v", err)
	}
	hostCC = func() (string, error) {
		return "", errors.New("open /proc/sys/net/ipv4/tcp_congestion_control: no such file or directory")
	}
	if _, err := parseFlags(t, false, "--wan-trunk", "auto").Config(); err == nil ||
		!strings.Contains(err.Error(), "--wan-trunk auto: cannot read this host's TCP congestion control") || !strings.Contains(err.Error(), "give --wan-trunk shared or parallel") {
		t.Errorf("auto, unreadable: %v", err)
	}
	hostCC = func() (string, error) { t.Error("remote auto read this host's congestion control"); return "bbr", nil }
	run := parseFlags(t, true, "--wan-trunk", "auto", "--wan-conns", "2")
	c, err := run.Config()
	if err != nil {
		t.Fatal(err)
	}
	if c.Trunk != TrunkAuto || strings.Join(run.Args(), " ") != "--wan-trunk=auto --wan-conns=2" {
		t.Errorf("remote auto: trunk %q, Args %q", c.Trunk, run.Args())
	}
	// A setting refused under either outcome is refused before any
	// gateway starts, naming the preset.
	if _, err := parseFlags(t, true, "--wan-trunk", "auto", "--wan-pace", "20kbit").Config(); err == nil ||
		!strings.Contains(err.Error(), "--wan-pace") || !strings.Contains(err.Error(), "with --wan-trunk auto, where it picks") {
		t.Errorf("remote auto with a refused pace: %v", err)
	}
}

func TestFlagsTrunkRefuse(t *testing.T) {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	NewFlags(fs, false)
	if err := fs.Parse([]string{"--wan-trunk", "wide"}); err == nil || !strings.Contains(err.Error(), `invalid argument "wide" for "--wan-trunk" flag`) ||
		!strings.Contains(err.Error(), "parallel") {
		t.Errorf("--wan-trunk wide: %v", err)
	}
	c := DefaultConfig()
	c.Trunk = "wide"
	if err := c.Validate(); err == nil || err.Error() != `--wan-trunk "wide": want shared, parallel, auto` {
		t.Errorf("Validate: %v", err)
	}
}
