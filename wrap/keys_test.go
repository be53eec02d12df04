package wrap

import (
	"context"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mpi5k/mpi5k/gateway/keyfile"
	"github.com/mpi5k/mpi5k/sitemap"
)

// A job's gateways get keys: the map lists one public key per site, and
// each gateway is started with --key naming a file that only its user may
// read, placed through the launcher, whose private key is the one the map
// lists for its site; the file is gone after the run.
func TestRunJobKeys(t *testing.T) {
	f := newFakeGateways(t)
	seen := t.TempDir()
	tmp := os.TempDir() // the fake launcher's TMPDIR, as this process's
	// A gateway command records its key file's name, mode and text as the
	// gateway would find them.
	script := `case "$*" in
*--key*)
	for a; do
		if [ "$prev" = --key ]; then echo "$a" > "` + seen + `/$site.path"; stat -c %a "$a" > "` + seen + `/$site.mode"; cp "$a" "` + seen + `/$site.key"; fi
		prev=$a
	done
	exec sleep 300;;
esac`
	c := failfastConfig(t, f, script, "exit 0")
	c.SharedFS, c.Keep = false, true
	code, err, _ := runBounded(t, c, 20*time.Second)
	if err != nil || code != 0 {
		t.Fatalf("code %d err %v", code, err)
	}
	m, err := sitemap.Load(filepath.Join(c.WorkDir, "sites.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if !m.HasKeys() {
		t.Fatal("the job's site map lists no gateway keys")
	}
	for _, site := range []string{"site1", "site2"} {
		mode, err := os.ReadFile(filepath.Join(seen, site+".mode"))
		if err != nil {
			t.Fatalf("site %s's gateway was started without a key file: %v", site, err)
		}
		if strings.TrimSpace(string(mode)) != "600" {
			t.Errorf("site %s's key file has mode %s, want 600", site, mode)
		}
		path, _ := os.ReadFile(filepath.Join(seen, site+".path"))
		if p := strings.TrimSpace(string(path)); !strings.HasPrefix(p, tmp+"/mpi5k-key.") {
			t.Errorf("site %s's key file is %s, want a new file under the host's TMPDIR", site, p)
		} else if _, err := os.Stat(p); err == nil {
			t.Errorf("site %s's key file %s is left after the run", site, p)
		}
		text, _ := os.ReadFile(filepath.Join(seen, site+".key"))
		k, err := keyfile.Parse(text)
		if err != nil {
			t.Fatal(err)
		}
		if s, ok := m.SiteByKey(k.Public().(ed25519.PublicKey)); !ok || s.Name != site {
			t.Errorf("site %s's gateway key is listed for %v in the map", site, s)
		}
	}
	if ents, _ := os.ReadDir(c.WorkDir); len(ents) > 0 {
		for _, e := range ents {
			if b, _ := os.ReadFile(filepath.Join(c.WorkDir, e.Name())); strings.Contains(string(b), "PRIVATE KEY") {
				t.Errorf("the workdir holds a private key: %s", e.Name())
			}
		}
	}
}

// --wan-plaintext: no keys, no --key, nothing to copy.
func TestRunPlaintext(t *testing.T) {
	c, out, _ := testConfig(t, "mpiexec.mpich", "-hosts", "node-1.site1,node-1.site2", "-n", "2", "./pp")
	c.DryRun, c.SharedFS, c.Plaintext = true, false, true
	if code, err := Run(context.Background(), c); err != nil || code != 0 {
		t.Fatal(code, err)
	}
	for _, no := range []string{"\nkey ", "--key", "keys/"} {
		if strings.Contains(out.String(), no) {
			t.Errorf("a plaintext dry run shows %q:\n%s", no, out.String())
		}
	}
}
