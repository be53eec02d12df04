package wrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	gw "github.com/mpi5k/mpi5k/gateway"
	"github.com/mpi5k/mpi5k/sitemap"
)

// A job's own gateways authenticate each other with keys made for the job
// (docs/security.md): each site's gateway gets a fresh Ed25519 key pair,
// its private key in a 0600 file only that gateway host is given, and the
// map lists every public key. Nothing else trusts those keys, so they
// authorize nothing once the job's gateways have exited.

// keyDir is where a job's private keys are, under its workdir.
func keyDir(workdir string) string { return filepath.Join(workdir, "keys") }

// keyPath is site's private key file.
func keyPath(workdir, site string) string { return filepath.Join(keyDir(workdir), site+".key") }

// jobKeys makes a key pair per site, the private keys under keyDir(dir),
// and returns the map's key records.
func jobKeys(sites []*Site, dir string) (string, error) {
	if err := os.Mkdir(keyDir(dir), 0o700); err != nil {
		return "", fmt.Errorf("gateway keys: %w", err)
	}
	var b strings.Builder
	for _, s := range sites {
		pub, err := gw.GenerateKey(keyPath(dir, s.Name))
		if err != nil {
			return "", fmt.Errorf("gateway key of site %s: %w", s.Name, err)
		}
		fmt.Fprintf(&b, "key %s %s\n", s.Name, sitemap.FormatKey(pub))
	}
	return b.String(), nil
}

// keyCopyCommand writes its standard input to path on host, readable by
// the user only.
func (c *Config) keyCopyCommand(host, path string) []string {
	argv := append([]string(nil), c.Launcher...)
	dir := filepath.Dir(path)
	return append(argv, host, fmt.Sprintf("umask 077 && mkdir -p %s && cat > %s", shellQuote(dir), shellQuote(path)))
}

// distributeKeys copies each site's private key to its gateway host only,
// in parallel, through the launcher.
func (c *Config) distributeKeys(ctx context.Context, sites []*Site) error {
	ctx, cancel := context.WithTimeout(ctx, launchTimeout)
	defer cancel()
	errs := make([]error, len(sites))
	var wg sync.WaitGroup
	for i, s := range sites {
		path := keyPath(c.WorkDir, s.Name)
		key, err := os.ReadFile(path)
		if err != nil {
			errs[i] = err
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			argv := c.keyCopyCommand(s.Gateway.Name, path)
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Stdin = strings.NewReader(string(key))
			cmd.WaitDelay = pipeDelay
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("copying site %s's gateway key to %s: %v: %s", s.Name, s.Gateway.Name, err, strings.TrimSpace(string(out)))
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
