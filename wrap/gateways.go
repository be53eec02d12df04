package wrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ExitGatewayFailed is the wrapper's exit status when a gateway failed
// while the job ran (its process exited, or it stayed unreachable or
// without a WAN link for GatewayOutage) and the job did not succeed: the
// last gateway of a site failed and the wrapper ended the job, or the job
// failed after a gateway whose site kept others had failed. As
// EX_TEMPFAIL of sysexits.h: the job may well run if started again.
const ExitGatewayFailed = 75

// GatewayOutage is how long a gateway may stay unreachable from the
// wrapper, or report a WAN link down (/ready), while the job runs before
// the wrapper ends the job. It is the gateways' own dead-link timeout
// (gateway.Config.DeadAfter, 10 s): a WAN pause the links survive does not
// end the job either, and one they do not survive has reset the job's
// streams through them (WAN links do not resume them yet).
const GatewayOutage = 10 * time.Second

// Bounds of the wrapper's start and teardown: whatever a launcher, a
// gateway or a host does, the wrapper goes on after these.
const (
	launchTimeout = 30 * time.Second       // copying the map to a host through the launcher
	pipeDelay     = 2 * time.Second        // a child's output pipes after it exited (a background child may hold them)
	stopEOF       = 2 * time.Second        // a gateway exits on its own once its stdin closes
	stopTERM      = 2 * time.Second        // then drains its streams after SIGTERM
	stopKILL      = 1 * time.Second        // then is gone after SIGKILL, or is left with a warning
	mpiTERM       = 3 * time.Second        // mpirun's own cleanup after SIGTERM before SIGKILL
	watchEvery    = 500 * time.Millisecond // /ready polls while the job runs
	readyEvery    = 20 * time.Millisecond  // /ready polls before the job: its start waits on the last
	probeTimeout  = time.Second            // one /ready request
)

// httpClient is the wrapper's client for the gateways' HTTP endpoints:
// every request is bounded, and no connection outlives its request, so
// none is left open to a gateway (or holds the wrapper) after the run.
func httpClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
}

// gateway is one gateway started through the launcher.
type gateway struct {
	site    *Site
	host    SiteHost // its host; unset: the site's (first) gateway host
	argv    []string
	metrics string // host:port of /ready and /metrics
	tag     string // its --ready-tag: /ready?tag= tells it from another job's
	// unprimed: ready once its links are up, priming or not
	// (/ready?primed=0: Config.StartWhen StartLinks).
	unprimed bool
	sites    string // a service gateway's /ready?sites=: the job's sites
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	logPath  string
	logName  string // "": gateway-SITE
	done     chan struct{}
	waitErr  error
}

// hostName is the name of the host the gateway runs on.
func (g *gateway) hostName() string {
	if g.host.Name != "" {
		return g.host.Name
	}
	return g.site.Gateway.Name
}

// label names the gateway in the summary: its site, with its host when
// it is one of the site's further gateway hosts.
func (g *gateway) label() string {
	if g.host.Name != "" && g.host.Name != g.site.Gateway.Name {
		return g.site.Name + "@" + g.host.Name
	}
	return g.site.Name
}

func (g *gateway) start(dir string) error {
	name := g.logName
	if name == "" {
		name = "gateway-" + g.site.Name
	}
	g.logPath = filepath.Join(dir, name+".log")
	log, err := os.Create(g.logPath)
	if err != nil {
		return err
	}
	g.cmd = exec.Command(g.argv[0], g.argv[1:]...)
	g.cmd.Stdout, g.cmd.Stderr = log, log
	g.cmd.WaitDelay = pipeDelay
	// setsid, as a daemon does: a Ctrl-C at the terminal reaches mpirun
	// while the gateways stay up until the summary is read and stop in
	// order; and under autogroup scheduling (Linux's default) a gateway
	// that shares cores with ranks weighs as a job of its own, not as one
	// more thread of the MPI job's autogroup beside its spinning ranks. (In
	// the lab, whose hosts share the machine's cores, BT under competing
	// traffic took 1.57x direct's time with the gateways in mpirun's
	// autogroup and 1.09x in their own.) The new process group is also
	// what stop signals.
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

// exited waits up to d for the gateway's launcher to exit.
func (g *gateway) exited(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-g.done:
		return true
	case <-t.C:
		return false
	}
}

// stop closes the gateway's stdin (the gateway runs with
// --exit-on-stdin-eof, which survives ssh), then signals the launcher's
// process group, and kills it if it lingers. Each step is
// bounded: a launcher that survives SIGKILL is reported on w and left.
func (g *gateway) stop(w io.Writer) {
	if g.cmd == nil || g.cmd.Process == nil {
		return
	}
	g.stdin.Close()
	if g.exited(stopEOF) {
		return
	}
	pid := g.cmd.Process.Pid
	syscall.Kill(-pid, syscall.SIGTERM)
	if g.exited(stopTERM) {
		return
	}
	syscall.Kill(-pid, syscall.SIGKILL)
	if !g.exited(stopKILL) {
		fmt.Fprintf(w, "mpi5k: site %s: the gateway launcher (pid %d) still runs %v after SIGKILL; left behind\n",
			g.site.Name, pid, stopKILL)
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

// probe asks the gateway's /ready once: nil when every WAN link is up.
func (g *gateway) probe(ctx context.Context, client *http.Client) error {
	u := "http://" + g.metrics + "/ready"
	q := url.Values{}
	switch {
	case g.tag != "":
		q.Set("tag", g.tag)
	case g.sites != "":
		q.Set("sites", g.sites)
	}
	if g.unprimed {
		q.Set("primed", "0")
	}
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusConflict:
		return errOtherJob
	default:
		return errLinkDown
	}
	return nil
}

var errLinkDown = errors.New("a WAN link is down")

// errOtherJob: the gateway answering on the port is another job's.
var errOtherJob = errors.New("another job's gateway answers on this port")

// errPortTaken: a gateway exited because one of its ports was in use.
var errPortTaken = errors.New("a gateway port is in use")

// waitReady polls every gateway's /ready until all are ready, one exits,
// or the timeout passes; errors name the site.
func waitReady(ctx context.Context, gws []*gateway, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := httpClient(probeTimeout)
	pending := append([]*gateway(nil), gws...)
	for len(pending) > 0 {
		var still []*gateway
		for _, g := range pending {
			select {
			case <-g.done:
				err := fmt.Errorf("site %s: the gateway on %s exited before it was ready (%v):\n%s",
					g.site.Name, g.hostName(), g.waitErr, g.logTail())
				if portTaken(g.logTail()) {
					err = fmt.Errorf("%w: %w", errPortTaken, err)
				}
				return err
			default:
			}
			if g.probe(ctx, client) != nil {
				still = append(still, g)
			}
		}
		pending = still
		if len(pending) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			// The logs' last lines say why (a peer that refuses the
			// links names the flags that differ).
			names := make([]string, len(pending))
			var tails strings.Builder
			for i, g := range pending {
				names[i] = fmt.Sprintf("%s (gateway %s, %s)", g.site.Name, g.hostName(), g.metrics)
				if t := g.logTail(); t != "" {
					fmt.Fprintf(&tails, "\nsite %s's gateway log (%s) ends:\n%s", g.site.Name, g.logPath, t)
				}
			}
			return fmt.Errorf("gateways not ready after %v: site %s%s", timeout, strings.Join(names, ", site "), tails.String())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(readyEvery):
		}
	}
	return nil
}

// gatewayFailure is a gateway that failed while the job ran.
type gatewayFailure struct {
	g    *gateway
	why  string
	of   int    // the gateways its site had (set by liveness.failed)
	tail string // the log's last lines when the job ended (the log may be removed after)
}

// Error is the wrapper's error when f's site had no gateway left: the job
// was ended.
func (f *gatewayFailure) Error() string {
	last := ""
	if f.of > 1 {
		last = fmt.Sprintf(", the last of its %d gateways", f.of)
	}
	return fmt.Sprintf("site %s: the gateway on %s %s%s; the job was ended. Last lines of its log:\n%s",
		f.g.site.Name, f.g.hostName(), f.why, last, indent(f.tail))
}

// liveness decides what a gateway failure means for the job: it goes on
// while every site has a gateway left (the shim and the node daemon put
// new connections on a site's other gateways, and a peer gateway's /ready
// asks only that some gateway of each site be up), and ends when a site
// has none.
type liveness struct {
	of   map[*Site]int // gateways of each site
	left map[*Site]int // those still alive
	dead []*gatewayFailure
	// resumable: the job's LANs are MX with node daemons, whose
	// connections move to another gateway (node/resume.go).
	resumable bool
}

func newLiveness(gws []*gateway) *liveness {
	l := &liveness{of: map[*Site]int{}, left: map[*Site]int{}}
	for _, g := range gws {
		l.of[g.site]++
		l.left[g.site]++
	}
	return l
}

// failed records f (once per gateway) and reports whether its site has no
// gateway left.
func (l *liveness) failed(f *gatewayFailure) (siteDown bool) {
	if l == nil {
		return true
	}
	for _, d := range l.dead {
		if d.g == f.g {
			return l.left[f.g.site] == 0
		}
	}
	f.of = l.of[f.g.site]
	l.dead = append(l.dead, f)
	if l.left[f.g.site] > 0 {
		l.left[f.g.site]--
	}
	return l.left[f.g.site] == 0
}

// survived is the line the wrapper prints when f's site has gateways
// left and the job goes on.
func (l *liveness) survived(f *gatewayFailure) string {
	n := l.left[f.g.site]
	others := "gateway"
	if n > 1 {
		others = "gateways"
	}
	what := "the ranks' connections through it are reset, new ones go to"
	if l.resumable {
		what = "the ranks' connections through it move, with new ones, to"
	}
	return fmt.Sprintf("mpi5k: site %s: the gateway on %s %s; %s the site's %d other %s; the job goes on\n",
		f.g.site.Name, f.g.hostName(), f.why, what, n, others)
}

// died names the gateways that died during the job, for the summary
// ("" if none).
func (l *liveness) died() string {
	if l == nil || len(l.dead) == 0 {
		return ""
	}
	parts := make([]string, len(l.dead))
	for i, f := range l.dead {
		parts[i] = fmt.Sprintf("%s (host %s, site %s) %s", f.g.label(), f.g.hostName(), f.g.site.Name, f.why)
	}
	return "  died during the job: " + strings.Join(parts, "; ")
}

// deathsError: the job failed after gateways died while their sites kept
// others; the ranks' connections through them were reset.
type deathsError struct {
	code int
	dead []*gatewayFailure
}

func (e *deathsError) Error() string {
	parts := make([]string, len(e.dead))
	for i, f := range e.dead {
		parts[i] = fmt.Sprintf("the gateway on %s (site %s) %s", f.g.hostName(), f.g.site.Name, f.why)
	}
	it := "it"
	if len(e.dead) > 1 {
		it = "them"
	}
	return fmt.Sprintf("the job failed (status %d) after %s: the ranks' connections through %s were reset",
		e.code, strings.Join(parts, ", and "), it)
}

func indent(s string) string {
	if s == "" {
		return "  (empty)"
	}
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}

// watch reports on the returned channel each gateway that fails while the
// job runs: its launcher exits (at once), or its /ready fails (no answer,
// or a WAN link down) for outage without a success in between. It stops
// when ctx ends.
func watch(ctx context.Context, gws []*gateway, outage time.Duration) <-chan *gatewayFailure {
	fails := make(chan *gatewayFailure, len(gws))
	client := httpClient(probeTimeout)
	for _, g := range gws {
		go func() {
			var since time.Time // first failed probe of the current outage
			tick := time.NewTicker(watchEvery)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-g.done:
					fails <- &gatewayFailure{g: g, why: fmt.Sprintf("exited during the job (%v)", g.waitErr)}
					return
				case <-tick.C:
				}
				err := g.probe(ctx, client)
				switch {
				case ctx.Err() != nil:
					return
				case err == nil:
					since = time.Time{}
					continue
				case since.IsZero():
					since = time.Now()
				}
				if d := time.Since(since); d >= outage {
					why := fmt.Sprintf("has not answered at %s for %v (%v)", g.metrics, d.Round(time.Second), err)
					if err == errLinkDown {
						why = fmt.Sprintf("has reported a WAN link down for %v", d.Round(time.Second))
					}
					fails <- &gatewayFailure{g: g, why: why}
					return
				}
			}
		}()
	}
	return fails
}

// runMPI runs the launcher with the terminal, forwards SIGINT, SIGTERM and
// SIGHUP to it, and returns its exit status. Gateway failures (fails, may
// be nil) go to live: one whose site has gateways left is logged and the
// job goes on. When ctx ends or a site has no gateway left it stops the
// launcher: SIGTERM, then after mpiTERM SIGKILL to it and every process
// it started on this host (also those it leaves behind when it exits on
// SIGTERM). The site's last gateway failure is returned with
// ExitGatewayFailed unless the launcher had exited 0 first; so is a job
// that failed after gateways died.
func runMPI(ctx context.Context, c Config, argv []string, fails <-chan *gatewayFailure, live *liveness) (int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, c.Stdout, c.Stderr
	// Stdout and Stderr other than files are copied from pipes, which a
	// rank or daemon left behind may hold open after the launcher exits.
	cmd.WaitDelay = pipeDelay
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return 127, fmt.Errorf("starting %s: %v", argv[0], err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var failed *gatewayFailure
	var kill <-chan time.Time
	var tree []proc // the launcher's processes when it was told to stop
	ctxDone := ctx.Done()
	terminate := func() {
		if kill == nil {
			tree = descendants(cmd.Process.Pid)
			kill = time.After(mpiTERM)
		}
		cmd.Process.Signal(syscall.SIGTERM)
	}
	for {
		select {
		case s := <-sigs:
			cmd.Process.Signal(s)
		case <-ctxDone:
			ctxDone = nil
			terminate()
		case f := <-fails:
			if !live.failed(f) {
				fmt.Fprint(c.Stderr, live.survived(f))
				continue
			}
			fails = nil
			failed = f
			terminate()
		case <-kill:
			killAll(append(tree, descendants(cmd.Process.Pid)...))
			cmd.Process.Kill()
		case err := <-done:
			if kill != nil {
				// A launcher that exits on SIGTERM may leave ranks or
				// daemons it started behind, reparented: none outlives the
				// job the wrapper ended.
				killAll(tree)
			}
			code, err := exitStatus(err)
			if failed == nil && code != 0 && fails != nil {
				// The ranks may have failed on a gateway's death first:
				// its launcher's exit is seen within moments.
				wait := time.After(300 * time.Millisecond)
			drain:
				for failed == nil {
					select {
					case f := <-fails:
						if live.failed(f) {
							failed = f
						} else {
							fmt.Fprint(c.Stderr, live.survived(f))
						}
					case <-wait:
						break drain
					}
				}
			}
			if failed != nil && (code != 0 || kill != nil) {
				failed.tail = failed.g.logTail()
				return ExitGatewayFailed, failed
			}
			if code != 0 && err == nil && kill == nil && live != nil && len(live.dead) > 0 {
				// Not ended by the wrapper (ctx): the job failed on its own.
				return ExitGatewayFailed, &deathsError{code: code, dead: live.dead}
			}
			return code, err
		}
	}
}

// exitStatus is the shell's view of a command's end: its exit code, or
// 128 + the signal that killed it.
func exitStatus(err error) (int, error) {
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

// proc is a process, told apart from a later one with its number by its
// start time.
type proc struct {
	pid   int
	start string // /proc/PID/stat field 22, in clock ticks since boot
}

// stat reads a process's parent and start time from /proc/PID/stat.
func stat(pid int) (ppid int, start string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", false
	}
	// The command name in parentheses may hold spaces: fields count from
	// the last ')'; f[0] is field 3 (state).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, "", false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, "", false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[19], err == nil
}

// killAll sends SIGKILL to each process still running as the same process.
func killAll(ps []proc) {
	for _, p := range ps {
		if _, start, ok := stat(p.pid); ok && start == p.start {
			syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
}

// descendants lists the processes below pid, from /proc's parent links
// (none where there is no /proc).
func descendants(pid int) []proc {
	ents, _ := os.ReadDir("/proc")
	children := map[int][]proc{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, start, ok := stat(p); ok {
			children[ppid] = append(children[ppid], proc{p, start})
		}
	}
	var out []proc
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out
}
