package cli

import (
	"context"
	"io"
	"log/slog"
	"os"
)

// StopOnStdinEOF returns a context cancelled when standard input closes.
// ssh gives a remote command no SIGHUP without a tty, but closes its stdin
// when the local ssh ends: for a daemon `mpi5k run` starts through a
// launcher (a gateway, a node daemon) that is the launcher's last word.
func StopOnStdinEOF(parent context.Context, log *slog.Logger, what string) context.Context {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		io.Copy(io.Discard, os.Stdin)
		log.Info("standard input closed: " + what)
		cancel()
	}()
	return ctx
}
