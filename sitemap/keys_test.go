package sitemap

import (
	"crypto/ed25519"
	"net/netip"
	"strings"
	"testing"
)

// Fixed keys: the 32 bytes are arbitrary; a public key is not checked to
// be a curve point until a signature is verified with it.
var (
	keyA = FormatKey(ed25519.PublicKey(strings.Repeat("a", 32)))
	keyB = FormatKey(ed25519.PublicKey(strings.Repeat("b", 32)))
	keyC = FormatKey(ed25519.PublicKey(strings.Repeat("c", 32)))
)

const keySites = "site s1 id=1 lan=10.0.1.1:5000 wan=10.1.1.1:5001\nsite s2 id=2 lan=10.0.2.1:5000 wan=10.1.2.1:5001\n"

func TestKeysParse(t *testing.T) {
	m := mustParse(t, keySites+"key s1 "+keyA+"\nkey s2 "+keyB+"\nkey s1 "+keyC+"  # rotation\n")
	s1, _ := m.Site("s1")
	if len(s1.Keys) != 2 || FormatKey(s1.Keys[0]) != keyA || FormatKey(s1.Keys[1]) != keyC {
		t.Fatalf("s1 keys = %v", s1.Keys)
	}
	k, _ := ParseKey(keyB)
	if s, ok := m.SiteByKey(k); !ok || s.Name != "s2" {
		t.Fatalf("SiteByKey(keyB) = %v, %v", s, ok)
	}
	if !m.HasKeys() || mustParse(t, keySites).HasKeys() {
		t.Fatal("HasKeys wrong")
	}
	want := "site s1 id=1 lan=10.0.1.1:5000 wan=10.1.1.1:5001\nkey s1 " + keyA + "\nkey s1 " + keyC + "\n"
	if !strings.HasPrefix(m.String(), want) {
		t.Fatalf("canonical text:\n%s\nwant prefix:\n%s", m, want)
	}
}

func TestKeysErrors(t *testing.T) {
	for _, c := range []struct{ name, text, want string }{
		{"fields", keySites + "key s1\n", `t.map:3: key: want "key <site> ed25519:<base64>", got 2 fields`},
		{"prefix", keySites + "key s1 rsa:AAAA\n", `t.map:3: key s1: bad key "rsa:AAAA": want ed25519:<base64>`},
		{"length", keySites + "key s1 ed25519:AAAA\n", `t.map:3: key s1: bad key "ed25519:AAAA": want ed25519: and the base64 of 32 bytes`},
		{"unknown site", keySites + "key s3 " + keyA + "\n", "t.map:3: key for unknown site s3"},
		{"twice", keySites + "key s1 " + keyA + "\nkey s2 " + keyB + "\nkey s1 " + keyA + "\n", "t.map:5: key " + keyA + " listed twice for site s1 (first at t.map:3)"},
		{"shared", keySites + "key s1 " + keyA + "\nkey s2 " + keyA + "\n", "t.map:4: key " + keyA + " of site s2 is already the key of site s1"},
		{"keyless site", keySites + "key s1 " + keyA + "\n", `t.map:2: site s2 has no key while other sites have`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(c.text), "t.map")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, c.want)
			}
		})
	}
}

func TestKeysBuilder(t *testing.T) {
	k, _ := ParseKey(keyA)
	_, err := NewBuilder().AddSite("s1", 1, mustAP("10.0.1.1:5000"), mustAP("10.1.1.1:5001")).
		AddSite("s2", 2, mustAP("10.0.2.1:5000"), mustAP("10.1.2.1:5001")).AddKey("s1", k).Build()
	if err == nil || !strings.Contains(err.Error(), "builder:2: site s2 has no key") {
		t.Fatalf("err = %v", err)
	}
}

// FuzzParseKey: ParseKey never panics, and what it accepts formats back
// to the same text.
func FuzzParseKey(f *testing.F) {
	f.Add(keyA)
	f.Add("ed25519:")
	f.Add("ed25519:AAAA====")
	f.Add("ed25519:" + strings.Repeat("A", 43) + "=\n")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey(s)
		if err != nil {
			return
		}
		if len(k) != ed25519.PublicKeySize || FormatKey(k) != s {
			t.Fatalf("ParseKey(%q) = %x, formats as %q", s, k, FormatKey(k))
		}
	})
}

func mustAP(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// nat=yes: the site behind NAT dials every peer whatever the ids, written
// back by String; it needs keys, and two such sites could not link.
func TestNAT(t *testing.T) {
	const s3 = "site s3 id=3 lan=10.0.3.1:5000 wan=10.1.3.1:5001 nat=yes\n"
	keys := "key s1 " + keyA + "\nkey s2 " + keyB + "\nkey s3 " + keyC + "\n"
	m := mustParse(t, keySites+s3+keys)
	s1, _ := m.Site("s1")
	s2, _ := m.Site("s2")
	n3, _ := m.Site("s3")
	if !n3.NAT || s1.NAT {
		t.Fatalf("NAT flags: s1 %v s3 %v", s1.NAT, n3.NAT)
	}
	for _, c := range []struct {
		a, b *Site
		want bool
	}{{s1, s2, true}, {s2, s1, false}, {n3, s1, true}, {s1, n3, false}, {n3, s2, true}, {s2, n3, false}} {
		if got := Dials(c.a, c.b); got != c.want {
			t.Errorf("Dials(%s, %s) = %v, want %v", c.a.Name, c.b.Name, got, c.want)
		}
	}
	if !strings.Contains(m.String(), "wan=10.1.3.1:5001 nat=yes\n") {
		t.Errorf("canonical text lacks nat=yes:\n%s", m)
	}
	if m2 := mustParse(t, m.String()); func() bool { s, _ := m2.Site("s3"); return !s.NAT }() {
		t.Error("nat=yes lost in a round trip")
	}
	for _, c := range []struct{ name, text, want string }{
		{"keyless", keySites + s3, "t.map:3: site s3: nat=yes needs gateway keys"},
		{"two", "site s1 id=1 lan=10.0.1.1:5000 wan=10.1.1.1:5001 nat=yes\nsite s2 id=2 lan=10.0.2.1:5000 wan=10.1.2.1:5001\n" + s3 + keys,
			"t.map:3: sites s1 and s3 are both nat=yes"},
		{"value", "site s1 id=1 lan=10.0.1.1:5000 wan=10.1.1.1:5001 nat=maybe\n", `t.map:1: site s1: bad nat "maybe": want yes or no`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(c.text), "t.map")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, c.want)
			}
		})
	}
}
