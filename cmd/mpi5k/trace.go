package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/mpi5k/mpi5k/internal/cli"
	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/mpi5k/mpi5k/trace"
)

func init() {
	register("trace", "analyse a traced run: report, graph, timeline, advise (docs/tracing.md)", traceMain)
}

const traceUsage = `usage: mpi5k trace report DIR [--json] [--map FILE]
       mpi5k trace graph DIR -o comm.svg|comm.png|comm.dot [--map FILE]
       mpi5k trace timeline DIR [--conn ID] -o t.png|t.svg [--map FILE]
       mpi5k trace advise DIR [--format machinefile|rankfile] [-o hosts] [--map FILE]

DIR holds the <host>.<pid>.trace files of a run traced with
'mpi5k run --trace DIR' or MPI5K_TRACE=DIR (docs/tracing.md).
`

func traceMain(args []string) int {
	sub, rest, code, done := cli.Subcommand(args, traceUsage, os.Stdout, os.Stderr)
	if done {
		return code
	}
	fs := pflag.NewFlagSet("mpi5k trace "+sub, pflag.ContinueOnError)
	cmd := cli.Command{Name: "mpi5k trace " + sub, Stdout: os.Stdout, Stderr: os.Stderr, Help: func(w io.Writer) {
		fmt.Fprint(w, traceUsage, "\nflags:\n", fs.FlagUsages(), cli.ExitStatusHelp(false))
	}}
	mapFile := fs.String("map", "", "site map (docs/sitemap-format.md) for addresses whose site the trace headers do not give")
	var (
		asJSON *bool
		out    *string
		conn   *string
		format *string
	)
	switch sub {
	case "report":
		asJSON = fs.Bool("json", false, "print the report as JSON")
	case "graph":
		out = fs.StringP("output", "o", "", "output file: .svg, .png, .pdf (rendered with graphviz dot) or .dot (DOT source only)")
	case "timeline":
		out = fs.StringP("output", "o", "", "output file: .png or .svg")
		conn = fs.String("conn", "", "connection id as in the report (default: the busiest WAN connection)")
	case "advise":
		out = fs.StringP("output", "o", "-", "host file to write (- = standard output; the summary goes to standard error)")
		format = fs.String("format", trace.FormatMachinefile, "host file format: machinefile (one host per line in rank order: mpiexec -f FILE, or Open MPI's mpirun --hostfile FILE --mca rmaps seq) or rankfile (Open MPI: mpirun --rankfile FILE)")
	default:
		fmt.Fprintf(os.Stderr, "mpi5k trace: unknown subcommand %q (want report, graph or timeline)\nRun 'mpi5k trace --help' for usage.\n", sub)
		return cli.ExitUsage
	}
	if code, done := cmd.Parse(fs, rest); done {
		return code
	}
	if fs.NArg() != 1 {
		return cmd.Usagef("want exactly one trace directory, got %d arguments", fs.NArg())
	}
	if out != nil && *out == "" {
		return cmd.Usagef("-o FILE is required")
	}
	fail := func(err error) int { return cmd.Failf("%v", err) }
	var m *sitemap.Map
	if *mapFile != "" {
		var err error
		if m, err = sitemap.Load(*mapFile); err != nil {
			return fail(err)
		}
	}
	tr, err := trace.Load(fs.Arg(0), m)
	if err != nil {
		return fail(err)
	}
	switch sub {
	case "report":
		r := trace.NewReport(tr)
		if *asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(r); err != nil {
				return fail(err)
			}
			return 0
		}
		if err := r.WriteText(os.Stdout); err != nil {
			return fail(err)
		}
	case "graph":
		ext := strings.TrimPrefix(strings.ToLower(filepath.Ext(*out)), ".")
		switch ext {
		case "dot", "gv", "svg", "png", "pdf":
		default:
			return fail(fmt.Errorf("output %s: want a .svg, .png, .pdf or .dot file", *out))
		}
		var src bytes.Buffer
		if err := trace.WriteDOT(&src, trace.NewReport(tr)); err != nil {
			return fail(err)
		}
		data := src.Bytes()
		if ext != "dot" && ext != "gv" {
			if data, err = trace.RenderDOT(data, ext); err != nil {
				return fail(err)
			}
		}
		if err := os.WriteFile(*out, data, 0o644); err != nil {
			return fail(err)
		}
	case "advise":
		g, err := trace.NewRankGraph(tr)
		if err != nil {
			return fail(err)
		}
		a := trace.Advise(g)
		var hf bytes.Buffer
		if err := a.WriteHostFile(&hf, *format); err != nil {
			return fail(fmt.Errorf("--format: %w", err))
		}
		summary := os.Stderr
		if *out != "-" {
			summary = os.Stdout
			if err := os.WriteFile(*out, hf.Bytes(), 0o644); err != nil {
				return fail(err)
			}
		} else if _, err := os.Stdout.Write(hf.Bytes()); err != nil {
			return fail(err)
		}
		if err := a.WriteText(summary); err != nil {
			return fail(err)
		}
	case "timeline":
		ext := strings.TrimPrefix(strings.ToLower(filepath.Ext(*out)), ".")
		if ext != "png" && ext != "svg" {
			return fail(fmt.Errorf("output %s: want a .png or .svg file", *out))
		}
		var c *trace.Conn
		if *conn != "" {
			if c, err = trace.FindConn(tr, *conn); err != nil {
				return fail(err)
			}
		} else if c = trace.BusiestConn(tr); c == nil {
			return fail(fmt.Errorf("no connection in %s", fs.Arg(0)))
		}
		var b bytes.Buffer
		if err := trace.Timeline(&b, c, ext); err != nil {
			return fail(err)
		}
		if err := os.WriteFile(*out, b.Bytes(), 0o644); err != nil {
			return fail(err)
		}
		fmt.Fprintf(os.Stderr, "timeline of %s (%s -> %s) written to %s\n", c.ID, c.Host, c.PeerHost, *out)
	}
	return 0
}
