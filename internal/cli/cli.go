// Package cli holds what every mpi5k command line shares: exit statuses,
// flag parsing that reports errors on stderr with a usage hint and help on
// stdout, and flag values checked where they are given (ports, ranges,
// sizes, rates, durations, congestion controls), so a bad value fails
// before anything starts and its message names the flag and the input.
package cli

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/pflag"
)

// Exit statuses of mpi5k and mpi5k-gateway (docs/cli.md). `mpi5k run`
// otherwise exits with the MPI launcher's own status.
const (
	ExitOK      = 0 // success, or --help / --version
	ExitFailure = 1 // a runtime failure: a file, a host, a gateway
	ExitUsage   = 2 // a bad command line: unknown flag, bad value, missing argument
)

// Command is one command line: its name as the user types it ("mpi5k
// run"), the help printed on stdout by --help, and where output goes.
type Command struct {
	Name           string
	Help           func(w io.Writer) // usage text, flags included
	Stdout, Stderr io.Writer
	// UnknownFlag, if set, follows the message of an unknown flag: what
	// the user most likely meant (mpi5k run: a launcher's flag given
	// before the launcher).
	UnknownFlag string
}

// Parse parses args into fs. done is true when the caller must return
// code at once: --help was given (help on stdout, ExitOK) or the command
// line is wrong (one message on stderr and a hint, ExitUsage).
func (c Command) Parse(fs *pflag.FlagSet, args []string) (code int, done bool) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {} // --help is answered below, on stdout
	err := fs.Parse(args)
	if errors.Is(err, pflag.ErrHelp) {
		c.Help(c.Stdout)
		return ExitOK, true
	}
	if err != nil {
		if c.UnknownFlag != "" && strings.HasPrefix(err.Error(), "unknown ") {
			return c.Usagef("%v\n%s", err, c.UnknownFlag), true
		}
		return c.Usagef("%v", err), true
	}
	return ExitOK, false
}

// Usagef reports a command-line mistake on stderr, with the hint that
// leads to the command's help, and returns ExitUsage.
func (c Command) Usagef(format string, a ...any) int {
	fmt.Fprintf(c.Stderr, "%s: %s\nRun '%s --help' for usage.\n", c.Name, fmt.Sprintf(format, a...), c.Name)
	return ExitUsage
}

// Failf reports a runtime failure on stderr and returns ExitFailure.
func (c Command) Failf(format string, a ...any) int {
	fmt.Fprintf(c.Stderr, "%s: %s\n", c.Name, fmt.Sprintf(format, a...))
	return ExitFailure
}

// Commit is the commit a binary was built from, set by the Makefile
// (-X); without it, the build's own record of it, if any.
var Commit string

// VersionText is what --version prints: the name and version on the
// first line (the version from git tags, set at build time), then the
// commit and toolchain from the build's own record, then features, a line
// on what this host's kernel gives (doctor.Features).
func VersionText(name, version, features string) string {
	commit, modified := Commit, ""
	if commit == "" {
		commit = "unknown"
	}
	goVersion, platform := runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && len(s.Value) >= 12 && Commit == "":
				commit = s.Value[:12]
			case s.Key == "vcs.modified" && s.Value == "true":
				modified = ", modified"
			}
		}
	}
	return fmt.Sprintf("%s %s\ncommit %s%s, built with %s for %s\nkernel: %s\n", name, version, commit, modified, goVersion, platform, features)
}

// ExitStatusHelp is the paragraph on exit statuses every help text ends
// with; launcher adds the line of `mpi5k run`.
func ExitStatusHelp(launcher bool) string {
	s := "exit status: 0 success, 1 runtime failure, 2 bad command line"
	if launcher {
		s += ";\n  75 a gateway failed while the job ran and the job did not succeed (docs/failures.md);\n" +
			"  otherwise the MPI launcher's own status (128+N if a signal N ended it)"
	}
	return s + "\n"
}

const advancedKey = "mpi5k-advanced"

// MarkAdvanced hides the named flags from --help: they are the tuning
// knobs whose defaults measurements settled, listed by --help-advanced.
func MarkAdvanced(fs *pflag.FlagSet, names ...string) {
	for _, n := range names {
		fs.SetAnnotation(n, advancedKey, []string{"true"})
		fs.MarkHidden(n)
	}
}

// AdvancedUsages lists the flags MarkAdvanced hid, as FlagUsages would.
func AdvancedUsages(fs *pflag.FlagSet) string {
	return UsagesOf(fs, func(f *pflag.Flag) bool { _, ok := f.Annotations[advancedKey]; return ok })
}

// UsagesOf is FlagUsages of the flags keep selects, hidden ones included.
func UsagesOf(fs *pflag.FlagSet, keep func(*pflag.Flag) bool) string {
	sub := pflag.NewFlagSet(fs.Name(), pflag.ContinueOnError)
	sub.SortFlags = fs.SortFlags
	fs.VisitAll(func(f *pflag.Flag) {
		if keep(f) {
			c := *f
			c.Hidden = false
			sub.AddFlag(&c)
		}
	})
	return sub.FlagUsages()
}

// Subcommand reads the subcommand word of a command with subcommands
// (mpi5k lab, trace, sitemap): none prints usage on stderr (ExitUsage),
// -h, --help or help prints it on stdout (ExitOK); done is then true and
// the caller returns code. Otherwise sub is the word and rest what follows.
func Subcommand(args []string, usage string, stdout, stderr io.Writer) (sub string, rest []string, code int, done bool) {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return "", nil, ExitUsage, true
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return "", nil, ExitOK, true
	}
	return args[0], args[1:], ExitOK, false
}
