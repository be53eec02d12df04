package wrap

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// --trace DIR names a directory on every rank host (MPI5K_TRACE): the run
// creates it there before the job and brings the traces back into the
// local DIR after it, so `mpi5k trace DIR` reads the whole job. With
// --shared-fs DIR is one directory everywhere and nothing is copied.

// traceHosts is each host of the job once, in order.
func traceHosts(hosts []Host) []string {
	seen := map[string]bool{}
	var out []string
	for _, h := range hosts {
		if !seen[h.Name] {
			seen[h.Name] = true
			out = append(out, h.Name)
		}
	}
	return out
}

func (c *Config) traceMkdirCommand(host string) []string {
	return append(append([]string(nil), c.Launcher...), host, "mkdir -p "+shellQuote(c.TraceDir))
}

// traceCollectCommand writes the host's trace files as a tar stream; a
// host whose ranks wrote none sends an empty archive.
func (c *Config) traceCollectCommand(host string) []string {
	return append(append([]string(nil), c.Launcher...), host,
		"cd "+shellQuote(c.TraceDir)+" && find . -maxdepth 1 -name '*.trace' -type f -print0 | tar -cf - --null -T -")
}

// prepareTrace creates the trace directory here and on every host.
func (c *Config) prepareTrace(ctx context.Context, hosts []string) error {
	if err := os.MkdirAll(c.TraceDir, 0o755); err != nil {
		return fmt.Errorf("--trace %s: %v", c.TraceDir, err)
	}
	if c.SharedFS {
		return nil
	}
	return c.onHosts(ctx, hosts, func(ctx context.Context, host string) error {
		argv := c.traceMkdirCommand(host)
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.WaitDelay = pipeDelay
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("--trace %s: creating it on %s: %v: %s", c.TraceDir, host, err, strings.TrimSpace(string(out)))
		}
		return nil
	})
}

// collectTrace copies every host's trace files into the local DIR and
// says how many came back; a host that fails is named, the others kept.
func (c *Config) collectTrace(ctx context.Context, hosts []string) {
	if c.SharedFS {
		return
	}
	var mu sync.Mutex
	files := 0
	err := c.onHosts(ctx, hosts, func(ctx context.Context, host string) error {
		argv := c.traceCollectCommand(host)
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.WaitDelay = pipeDelay
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		n, xerr := untarTraces(out, c.TraceDir)
		io.Copy(io.Discard, out)
		werr := cmd.Wait()
		mu.Lock()
		files += n
		mu.Unlock()
		if err := errors.Join(xerr, werr); err != nil {
			return fmt.Errorf("%s: %v: %s", host, err, strings.TrimSpace(stderr.String()))
		}
		return nil
	})
	fmt.Fprintf(c.Stderr, "mpi5k: %d trace files from %d hosts in %s\n", files, len(hosts), c.TraceDir)
	if err != nil {
		fmt.Fprintf(c.Stderr, "mpi5k: --trace: some traces were not collected: %v\n", err)
	}
}

// untarTraces writes the *.trace regular files of a tar stream into dir,
// each through a temporary name: on the launching host the archive is
// read from the very files it replaces.
func untarTraces(r io.Reader, dir string) (int, error) {
	tr := tar.NewReader(r)
	n := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		name := filepath.Base(h.Name)
		if h.Typeflag != tar.TypeReg || !strings.HasSuffix(name, ".trace") {
			continue
		}
		tmp, err := os.CreateTemp(dir, ".collect-*")
		if err != nil {
			return n, err
		}
		_, err = io.Copy(tmp, tr)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), filepath.Join(dir, name))
		}
		if err != nil {
			os.Remove(tmp.Name())
			return n, err
		}
		n++
	}
}

// onHosts runs f for every host at once, bounded by launchTimeout.
func (c *Config) onHosts(ctx context.Context, hosts []string, f func(context.Context, string) error) error {
	ctx, cancel := context.WithTimeout(ctx, launchTimeout)
	defer cancel()
	errs := make([]error, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(ctx, h) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// printTrace prints a dry run's trace commands.
func (c *Config) printTrace(w io.Writer, hosts []string) {
	if c.TraceDir == "" || c.SharedFS {
		return
	}
	fmt.Fprintf(w, "# trace directory on every host:\n")
	for _, h := range hosts {
		fmt.Fprintln(w, shellJoin(c.traceMkdirCommand(h)))
	}
	fmt.Fprintf(w, "# after the job, the traces come back into %s from:\n", c.TraceDir)
	for _, h := range hosts {
		fmt.Fprintln(w, shellJoin(c.traceCollectCommand(h)))
	}
}
