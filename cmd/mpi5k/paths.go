package main

import (
	"os"
	"path/filepath"
)

// shimPath is where libmpi5k.so is beside the mpi5k binary in bindir: the
// build tree keeps it in bin/ with the binaries, `make install` in
// <prefix>/lib/mpi5k/ beside <prefix>/bin/. The first that exists wins;
// if neither does, the build tree's path (the error names it).
func shimPath(bindir string) string {
	build := filepath.Join(bindir, "libmpi5k.so")
	for _, p := range []string{build, filepath.Join(bindir, "..", "lib", "mpi5k", "libmpi5k.so")} {
		if _, err := os.Stat(p); err == nil {
			return filepath.Clean(p)
		}
	}
	return build
}
