// Command mpi5k is the user tool of mpi5k: it manages the emulated grid
// (lab), wraps mpirun (run), analyses traces (trace) and runs the
// with/without-gateway comparison (bench). Each subcommand lives in its own
// file and registers itself in init, so features land without touching this
// dispatcher.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/mpi5k/mpi5k/internal/cli"
)

type command struct {
	summary string
	run     func(args []string) int // returns the process exit status
}

var commands = map[string]command{}

func register(name, summary string, run func(args []string) int) {
	if _, dup := commands[name]; dup {
		panic("mpi5k: subcommand registered twice: " + name)
	}
	commands[name] = command{summary, run}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: mpi5k <command> [arguments]\n       mpi5k --version\n\nmpi5k runs MPI jobs across sites through per-site gateways.\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "\nRun 'mpi5k <command> --help' for a command's flags; docs/cli.md lists them all.\n%s", cli.ExitStatusHelp(true))
}

func main() {
	_ = cli.CloseInheritedOnExec() // best effort: without /proc the command still runs
	os.Exit(mpi5k(os.Args[1:], os.Stdout, os.Stderr))
}

func mpi5k(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return cli.ExitUsage
	}
	switch args[0] {
	case "-h", "--help", "help":
		usage(stdout)
		return cli.ExitOK
	case "--version", "-V":
		args[0] = "version"
	}
	c, ok := commands[args[0]]
	if !ok {
		what := "command"
		if strings.HasPrefix(args[0], "-") {
			what = "flag"
		}
		fmt.Fprintf(stderr, "mpi5k: unknown %s %q\nRun 'mpi5k --help' for usage.\n", what, args[0])
		return cli.ExitUsage
	}
	return c.run(args[1:])
}
