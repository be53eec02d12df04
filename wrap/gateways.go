package wrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// gateway is one gateway started through the launcher.
type gateway struct {
	site    *Site
	argv    []string
	metrics netip.AddrPort
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	logPath string
	done    chan struct{}
	waitErr error
	last    string // last /metrics scrape
}

func (g *gateway) start(dir string) error {
	g.logPath = filepath.Join(dir, "gateway-"+g.site.Name+".log")
	log, err := os.Create(g.logPath)
	if err != nil {
		return err
	}
	g.cmd = exec.Command(g.argv[0], g.argv[1:]...)
	g.cmd.Stdout, g.cmd.Stderr = log, log
	// Own session, as a daemon has: a Ctrl-C at the terminal reaches mpirun
	// while the gateways stay up until the summary is read and stop in
	// order; and under autogroup scheduling (Linux's default) a gateway
	// that shares cores with ranks weighs as a job of its own, not as one
	// more thread of the MPI job's session beside its spinning ranks. (In
	// the lab, whose hosts share the machine's cores, BT under competing
	// traffic took 1.57x direct's time with the gateways in mpirun's
	// session and 1.09x in their own.) The session is also the process
	// group stop signals.
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if g.stdin, err = g.cmd.StdinPipe(); err != nil {
		log.Close()
		return err
	}
	if err := g.cmd.Start(); err != nil {
		log.Close()
		return err
	}
	log.Close()
	g.done = make(chan struct{})
	go func() { g.waitErr = g.cmd.Wait(); close(g.done) }()
	return nil
}

// stop closes the gateway's stdin (the gateway runs with
// --exit-on-stdin-eof, which survives ssh), then signals the launcher's
// session (its process group), and kills it if it lingers.
func (g *gateway) stop() {
	if g.cmd == nil || g.cmd.Process == nil {
		return
	}
	g.stdin.Close()
	select {
	case <-g.done:
		return
	case <-time.After(2 * time.Second):
	}
	syscall.Kill(-g.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(3 * time.Second):
		syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL)
		<-g.done
	}
}

func (g *gateway) logTail() string {
	b, _ := os.ReadFile(g.logPath)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, "\n")
}

// waitReady polls every gateway's /ready until all are ready, one exits,
// or the timeout passes; errors name the site.
func waitReady(ctx context.Context, gws []*gateway, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	pending := append([]*gateway(nil), gws...)
	for len(pending) > 0 {
		var still []*gateway
		for _, g := range pending {
			select {
			case <-g.done:
				return fmt.Errorf("site %s: the gateway on %s exited before it was ready (%v):\n%s",
					g.site.Name, g.site.Gateway.Name, g.waitErr, g.logTail())
			default:
			}
			resp, err := client.Get("http://" + g.metrics.String() + "/ready")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					continue
				}
			}
			still = append(still, g)
		}
		pending = still
		if len(pending) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			names := make([]string, len(pending))
			for i, g := range pending {
				names[i] = fmt.Sprintf("%s (gateway %s, %s)", g.site.Name, g.site.Gateway.Name, g.metrics)
			}
			return fmt.Errorf("gateways not ready after %v: site %s", timeout, strings.Join(names, ", site "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// runMPI runs the launcher with the terminal, forwards SIGINT, SIGTERM and
// SIGHUP to it, and returns its exit status.
func runMPI(ctx context.Context, c Config, argv []string) (int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, c.Stdout, c.Stderr
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return 127, fmt.Errorf("starting %s: %v", argv[0], err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			cmd.Process.Signal(s)
		case <-ctx.Done():
			cmd.Process.Signal(syscall.SIGTERM)
		case err := <-done:
			if err == nil {
				return 0, nil
			}
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					return 128 + int(ws.Signal()), nil
				}
				return ee.ExitCode(), nil
			}
			return 1, err
		}
	}
}
