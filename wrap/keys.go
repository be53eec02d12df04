package wrap

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"

	"github.com/mpi5k/mpi5k/gateway/keyfile"
	"github.com/mpi5k/mpi5k/sitemap"
)

// A job's own gateways authenticate each other with keys made for the job
// (docs/security.md): each site's gateway gets a fresh Ed25519 key pair,
// and the map lists every public key. The private keys exist only in this
// process's memory and, through the launcher, in a private temporary file
// on each gateway host, written as the user the gateway runs as and
// removed after the run. Nothing else trusts those keys, so they authorize
// nothing once the job's gateways have exited.

// jobKeys are a job's gateway keys.
type jobKeys struct {
	pem   map[string][]byte // site -> private key file text
	recs  string            // the map's key records
	files map[string]string // site -> key file on its gateway host (placeKeys)
}

// newJobKeys makes a key pair per site.
func newJobKeys(sites []*Site) (*jobKeys, error) {
	k := &jobKeys{pem: map[string][]byte{}, files: map[string]string{}}
	var b strings.Builder
	for _, s := range sites {
		pub, text, err := keyfile.New()
		if err != nil {
			return nil, fmt.Errorf("gateway key of site %s: %w", s.Name, err)
		}
		k.pem[s.Name] = text
		fmt.Fprintf(&b, "key %s %s\n", s.Name, sitemap.FormatKey(pub))
	}
	k.recs = b.String()
	return k, nil
}

// keyDryRun stands for a key file's path in a dry run's commands.
const keyDryRun = "KEYFILE"

// keyPlaceCommand writes its standard input to a new temporary file on
// host that only the launcher's user may read, and prints its path. The
// script is one quoted sh -c argument: a launcher that runs the command
// as another user (setpriv, sudo -u, before it) runs all of it so.
func (c *Config) keyPlaceCommand(host string) []string {
	argv := append([]string(nil), c.Launcher...)
	return append(argv, host, "sh -c "+shellQuote(`umask 077 && f=$(mktemp "${TMPDIR:-/tmp}/mpi5k-key.XXXXXX") && cat > "$f" && echo "$f"`))
}

// placeKeys puts each site's private key on its gateway host only, in
// parallel, through the launcher, and records where (a retry keeps the
// files placed before).
func (c *Config) placeKeys(ctx context.Context, sites []*Site, k *jobKeys) error {
	ctx, cancel := context.WithTimeout(ctx, launchTimeout)
	defer cancel()
	type at struct {
		s    *Site
		host string
	}
	var ats []at
	for _, s := range sites {
		for _, h := range s.gatewayHosts() {
			ats = append(ats, at{s, h.Name})
		}
	}
	errs := make([]error, len(ats))
	paths := make([]string, len(ats))
	var wg sync.WaitGroup
	for i, a := range ats {
		s := a.s
		if k.files[keyAt(s.Name, a.host)] != "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			argv := c.keyPlaceCommand(a.host)
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Stdin = strings.NewReader(string(k.pem[s.Name]))
			cmd.WaitDelay = pipeDelay
			out, err := cmd.Output()
			p := strings.TrimSpace(string(out))
			if err == nil && (p == "" || strings.ContainsAny(p, "\n")) {
				err = fmt.Errorf("the command printed %q, not the key file's path", out)
			}
			if err != nil {
				errs[i] = fmt.Errorf("placing site %s's gateway key on %s: %v", s.Name, a.host, err)
				return
			}
			paths[i] = p
		}()
	}
	wg.Wait()
	for i, a := range ats {
		if paths[i] != "" {
			k.files[keyAt(a.s.Name, a.host)] = paths[i]
		}
	}
	return errors.Join(errs...)
}

// keyAt is the key of jobKeys.files: a site's key file on one of its
// gateway hosts.
func keyAt(site, host string) string { return site + " " + host }

// removeKeys deletes the key files placeKeys made, each through the
// launcher; a failure is reported on the wrapper's stderr.
func (c *Config) removeKeys(sites []*Site, k *jobKeys) {
	ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
	defer cancel()
	stderr := &serialWriter{w: c.Stderr}
	var wg sync.WaitGroup
	for _, s := range sites {
		for _, h := range s.gatewayHosts() {
			p := k.files[keyAt(s.Name, h.Name)]
			if p == "" {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				argv := append(append([]string(nil), c.Launcher...), h.Name, "rm -f "+shellQuote(p))
				cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
				cmd.WaitDelay = pipeDelay
				if out, err := cmd.CombinedOutput(); err != nil {
					fmt.Fprintf(stderr, "mpi5k: site %s: removing the gateway's key file %s on %s: %v %s\n", s.Name, p, h.Name, err, strings.TrimSpace(string(out)))
				}
			}()
		}
	}
	wg.Wait()
}

// printKeyPlacing shows a dry run's key placing commands.
func (c *Config) printKeyPlacing(sites []*Site) {
	fmt.Fprintf(c.Stdout, "# each gateway's private key, on its host only, into a new file only its user reads (%s below):\n", keyDryRun)
	for _, s := range sites {
		for _, h := range s.gatewayHosts() {
			fmt.Fprintln(c.Stdout, shellJoin(c.keyPlaceCommand(h.Name)))
		}
	}
}

// withKey is a gateway command with its key file.
func withKey(argv []string, path string) []string {
	return append(append([]string(nil), argv...), "--key", path)
}
