package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSitemapCommand(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.map")
	os.WriteFile(good, []byte("site s1 id=1 lan=10.1.0.2:5000 wan=10.1.0.2:5001\nnet s1 10.1.0.0/24\nhost s1 gw.s1 10.1.0.2\n"+
		"site s2 id=2 lan=10.2.0.2:5000 wan=10.2.0.2:5001\nhost s2 n.s2 10.2.0.7\n"), 0o644)
	bad := filepath.Join(dir, "bad.map")
	os.WriteFile(bad, []byte("site s1 id=1 lan=10.1.0.2:5000\nnet s1 10.1.0.1/24\n"), 0o644)

	for _, tc := range []struct {
		args   []string
		status int
		out    []string
	}{
		{[]string{"check", good}, 0, []string{"site s1", "id=1", "nets=1 hosts=1", "site s2"}},
		{[]string{"check", "--canonical", good}, 0, []string{"site s1 id=1 lan=10.1.0.2:5000 wan=10.1.0.2:5001\nnet s1 10.1.0.0/24\n"}},
		{[]string{"check", bad}, 1, []string{bad + ":1: site s1 has no gateway: missing wan=", bad + ":2: net s1: 10.1.0.1/24 is not canonical"}},
		{[]string{"check"}, 2, []string{"usage"}},
		{[]string{"lookup", good, "10.1.0.9", "10.2.0.2", "n.S2", "node-3.s1", "node-3.s9", "192.0.2.1"}, 1, []string{
			"10.1.0.9\ts1\t(address)", "10.2.0.2\ts2\t(gateway address outside the site's nets)", "n.S2\ts2\t(host)",
			"node-3.s1\ts1\t(Grid'5000 name)", "node-3.s9\ts9\t(Grid'5000 name, site not in the map)", "192.0.2.1\t-\t(in no site)"}},
		{[]string{"frob"}, 2, []string{"unknown subcommand"}},
	} {
		var out, errb strings.Builder
		status := runSitemap(tc.args, &out, &errb)
		all := out.String() + errb.String()
		if status != tc.status {
			t.Errorf("%v: status %d, want %d\n%s", tc.args, status, tc.status, all)
		}
		for _, w := range tc.out {
			if !strings.Contains(all, w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, all)
			}
		}
	}
}
