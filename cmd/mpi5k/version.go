package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"

	"github.com/mpi5k/mpi5k/doctor"
	"github.com/mpi5k/mpi5k/internal/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func init() {
	register("version", "print the mpi5k version (also: mpi5k --version)", func(args []string) int {
		fs := pflag.NewFlagSet("mpi5k version", pflag.ContinueOnError)
		cmd := cli.Command{Name: "mpi5k version", Stdout: os.Stdout, Stderr: os.Stderr,
			Help: func(w io.Writer) { fmt.Fprintf(w, "usage: mpi5k version\n       mpi5k --version\n") }}
		if code, done := cmd.Parse(fs, args); done {
			return code
		}
		if fs.NArg() > 0 {
			return cmd.Usagef("unexpected argument %q", fs.Arg(0))
		}
		fmt.Print(cli.VersionText("mpi5k", version, doctor.Features(doctor.Local())))
		return cli.ExitOK
	})
}
