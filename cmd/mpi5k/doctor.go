package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mpi5k/mpi5k/doctor"
	"github.com/mpi5k/mpi5k/internal/cli"
	"github.com/mpi5k/mpi5k/wrap"
	"github.com/spf13/pflag"
)

func init() {
	register("doctor", "check what mpi5k can do on this host or on HOSTS, and how to fix what it cannot", doctorMain)
}

func doctorMain(args []string) int {
	fs := pflag.NewFlagSet("mpi5k doctor", pflag.ContinueOnError)
	self, _ := os.Executable()
	bindir := filepath.Dir(self)
	launcher := fs.String("launcher", "ssh", "command that runs a command on a host, e.g. oarsh")
	remote := fs.String("mpi5k", self, "path of mpi5k on HOSTS")
	lanPort, wanPort := 5000, 5001
	fs.Var(cli.IntRange{P: &lanPort, Min: 0, Max: 65535, What: "port"}, "lan-port", "gateway port for its site's ranks, checked free (0: skip)")
	fs.Var(cli.IntRange{P: &wanPort, Min: 0, Max: 65535, What: "port"}, "wan-port", "gateway port for peer gateways, checked free (0: skip)")
	preload := fs.String("preload", shimPath(bindir), "path of libmpi5k.so on the rank hosts (\"\": skip)")
	reach := fs.StringArray("reach", nil, "HOST:PORT of another site's gateway to connect to (repeatable)")
	reachWAN := fs.Bool("reach-wan", true, "with HOSTS: each host connects to the other HOSTS' --wan-port")
	timeout := fs.Duration("timeout", 3*time.Second, "connect timeout of a reach check")
	local := fs.Bool("local", false, "check this host only (what each of HOSTS runs)")
	asJSON := fs.Bool("json", false, "print the report as JSON: {\"hosts\": [{\"host\", \"results\": [{\"status\", \"check\", \"detail\", \"fix\"}]}], \"failed\"}")
	c := cli.Command{Name: "mpi5k doctor", Stdout: os.Stdout, Stderr: os.Stderr, Help: func(w io.Writer) {
		fmt.Fprint(w, "usage: mpi5k doctor [flags] [HOSTS...]\n\nWithout HOSTS, checks this host. With HOSTS, runs mpi5k doctor on each\nthrough --launcher and prints each host's report; every host then also\ndials the others' --wan-port (give the gateway hosts, or --reach-wan=false).\n\nflags:\n",
			fs.FlagUsages(), "exit status: 0 every check passed or warned, 1 a check failed, 2 bad command line\n")
	}}
	if code, done := c.Parse(fs, args); done {
		return code
	}
	for _, r := range *reach {
		host, port, err := net.SplitHostPort(r)
		if err != nil || host == "" {
			return c.Usagef("--reach %q: want HOST:PORT, e.g. gw.site2:5001 or [2001:db8::2]:5001 (the other gateway's WAN port)", r)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return c.Usagef("--reach %q: port %q out of range 1..65535", r, port)
		}
	}
	opts := doctor.Options{LANPort: lanPort, WANPort: wanPort, Shim: *preload, Reach: *reach, DialTimeout: *timeout,
		JobPorts: [2]int{wrap.PortsFrom, wrap.PortsTo}}
	hosts := fs.Args()
	if *local || len(hosts) == 0 {
		if *local && len(hosts) > 0 {
			return c.Usagef("--local takes no HOSTS (got %q)", hosts)
		}
		rs := doctor.Run(doctor.Local(), opts)
		if *asJSON {
			return writeJSON([]doctor.HostReport{{Results: rs}})
		}
		if doctor.Write(os.Stdout, "", rs) {
			return 1
		}
		return 0
	}
	lw := strings.Fields(*launcher)
	if len(lw) == 0 {
		return c.Usagef("--launcher is empty")
	}
	// Every host at once; each report is printed whole, in HOSTS order.
	reports := make([]doctor.HostReport, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		cmd := []string{*remote, "doctor", "--local",
			"--lan-port", strconv.Itoa(lanPort), "--wan-port", strconv.Itoa(wanPort),
			"--preload", *preload, "--timeout", timeout.String(), "--json"}
		for _, r := range *reach {
			cmd = append(cmd, "--reach", r)
		}
		if *reachWAN && wanPort > 0 {
			for _, o := range hosts {
				if o != h {
					cmd = append(cmd, "--reach", net.JoinHostPort(o, strconv.Itoa(wanPort)))
				}
			}
		}
		// The launcher hands one command line to the host's shell.
		argv := append(append([]string(nil), lw...), h, wrap.ShellJoin(cmd))
		wg.Add(1)
		go func() {
			defer wg.Done()
			reports[i] = remoteDoctor(h, lw[0], argv, *timeout+30*time.Second)
		}()
	}
	wg.Wait()
	if *asJSON {
		return writeJSON(reports)
	}
	code := 0
	for _, r := range reports {
		if doctor.Write(os.Stdout, r.Host, r.Results) {
			code = 1
		}
	}
	return code
}

// writeJSON prints the reports as one JSON object; the status is 1 if a
// check failed.
func writeJSON(rs []doctor.HostReport) int {
	out := struct {
		Hosts  []doctor.HostReport `json:"hosts"`
		Failed bool                `json:"failed"`
	}{Hosts: rs}
	for _, r := range rs {
		for _, x := range r.Results {
			out.Failed = out.Failed || x.Status == doctor.Fail
		}
	}
	b, _ := json.MarshalIndent(out, "", "  ")
	fmt.Println(string(b))
	if out.Failed {
		return 1
	}
	return 0
}

// remoteDoctor runs argv (the launcher's command for host, which asks
// for a JSON report) and returns host's report, led by a line on the
// launcher's reach.
func remoteDoctor(host, launcher string, argv []string, limit time.Duration) doctor.HostReport {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	c.Stdin = nil
	var out, errb strings.Builder
	c.Stdout, c.Stderr = &out, &errb
	start := time.Now()
	err := c.Run()
	took := time.Since(start)
	var rep struct {
		Hosts []doctor.HostReport `json:"hosts"`
	}
	code := c.ProcessState.ExitCode()
	if (err == nil || code == 1) && json.Unmarshal([]byte(out.String()), &rep) == nil && len(rep.Hosts) == 1 { // 1: the report has a FAIL
		reached := doctor.Result{Status: doctor.OK, Check: "launcher",
			Detail: fmt.Sprintf("%s reached %s and ran mpi5k there (%.1f s, the report included)", launcher, host, took.Seconds())}
		return doctor.HostReport{Host: host, Results: append([]doctor.Result{reached}, rep.Hosts[0].Results...)}
	}
	detail := fmt.Sprintf("%s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(errb.String()))
	if err == nil || code == 1 {
		detail = fmt.Sprintf("%s: no report came back: %s", strings.Join(argv, " "), strings.TrimSpace(out.String()+" "+errb.String()))
	}
	return doctor.HostReport{Host: host, Results: []doctor.Result{{Status: doctor.Fail, Check: "launcher", Detail: detail,
		Fix: "check that --launcher reaches the host without a password and that mpi5k is at --mpi5k there (make install, or the mpi5k package)"}}}
}
