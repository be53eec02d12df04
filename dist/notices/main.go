// Command notices writes the third-party notices of mpi5k's binaries: for
// each Go module compiled into them (and Go's standard library), its
// version, the license licensecheck identifies in its license file, and
// that file's text. `make deb` installs the result beside Debian's
// copyright file, so the package carries every license it must.
//
// usage: go run ./dist/notices [-o FILE] PACKAGE...
//
// A module without a license file, or whose license licensecheck cannot
// name, is an error naming the module: a new dependency must be looked at.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/google/licensecheck"
)

func main() {
	out := flag.String("o", "", "write the notices to FILE (default: standard output)")
	list := flag.Bool("list", false, "write only a line per module, \"path version: license\", each led by a space (a Comment field of Debian's copyright file)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: notices [-o FILE] PACKAGE...")
		os.Exit(2)
	}
	mods, err := modules(flag.Args())
	if err == nil {
		var b bytes.Buffer
		if err = write(&b, mods, *list); err == nil {
			if *out == "" {
				_, err = os.Stdout.Write(b.Bytes())
			} else {
				err = os.WriteFile(*out, b.Bytes(), 0o644)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "notices:", err)
		os.Exit(1)
	}
}

// module is one module the binaries contain.
type module struct {
	Path, Version, Dir string
}

// modules lists the modules pkgs are built from, Go's standard library
// first, the main module left out.
func modules(pkgs []string) ([]module, error) {
	args := append([]string{"list", "-deps", "-f", "{{if .Module}}{{if not .Module.Main}}{{.Module.Path}}\t{{.Module.Version}}\t{{.Module.Dir}}{{end}}{{end}}"}, pkgs...)
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %v: %s", err, stderr.String())
	}
	mods := []module{{Path: "Go standard library", Version: runtime.Version(), Dir: runtime.GOROOT()}}
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	var rest []module
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 3 || seen[f[0]] {
			continue
		}
		seen[f[0]] = true
		if f[2] == "" {
			return nil, fmt.Errorf("module %s %s has no source directory: run go mod download", f[0], f[1])
		}
		rest = append(rest, module{f[0], f[1], f[2]})
	}
	slices.SortFunc(rest, func(a, b module) int { return strings.Compare(a.Path, b.Path) })
	return append(mods, rest...), nil
}

// licenseFiles are the names a module's license goes by, in its root.
var licenseFiles = []string{"LICENSE", "LICENSE.txt", "LICENSE.md", "LICENCE", "COPYING", "License", "license"}

// write writes one section per module: a line naming it and its license,
// then the license text and the module's NOTICE, if it has one (Apache-2.0
// asks that it go along); with list, only the lines.
func write(w io.Writer, mods []module, list bool) error {
	if !list {
		fmt.Fprintf(w, "Third-party notices of mpi5k\n\nThe binaries of mpi5k (mpi5k, mpi5k-gateway, libmpi5k.so) are built from mpi5k's own\ncode (Apache-2.0) and from the following Go modules, each under its own license,\nwhose text follows.\n\n")
	}
	var errs []error
	for _, m := range mods {
		text, name, err := licenseOf(m.Path, m.Dir)
		if err != nil {
			errs = append(errs, fmt.Errorf("module %s %s: %w", m.Path, m.Version, err))
			continue
		}
		if list {
			fmt.Fprintf(w, " %s %s: %s\n", m.Path, m.Version, name)
			continue
		}
		if b, err := os.ReadFile(filepath.Join(m.Dir, "NOTICE")); err == nil {
			text.file += ", NOTICE"
			text.body += "\n" + string(b)
		}
		fmt.Fprintf(w, "==============================================================================\n%s %s: %s (%s)\n\n%s\n",
			m.Path, m.Version, name, text.file, strings.TrimRight(text.body, "\n")+"\n")
	}
	return errors.Join(errs...)
}

type licenseText struct{ file, body string }

// chosen names the license of modules whose license file only points to
// others, read and named here by hand, and the files that hold it.
var chosen = map[string]struct {
	license string
	files   []string
}{
	// LICENSE offers the FreeType License or the GPL; mpi5k takes the FTL.
	"github.com/golang/freetype": {"FTL (chosen of FTL OR GPL-2.0-or-later)", []string{"LICENSE", "licenses/ftl.txt"}},
}

// licenseOf reads the license file of module path in dir and names its
// license(s).
func licenseOf(path, dir string) (licenseText, string, error) {
	if c, ok := chosen[path]; ok {
		var body []string
		for _, f := range c.files {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				return licenseText{}, "", err
			}
			body = append(body, string(b))
		}
		return licenseText{strings.Join(c.files, ", "), strings.Join(body, "\n")}, c.license, nil
	}
	for _, n := range licenseFiles {
		p := filepath.Join(dir, n)
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cov := licensecheck.Scan(b)
		var ids []string
		for _, m := range cov.Match {
			if !slices.Contains(ids, m.ID) {
				ids = append(ids, m.ID)
			}
		}
		if len(ids) == 0 || cov.Percent < 75 {
			return licenseText{}, "", fmt.Errorf("%s: licensecheck names no license (%.0f%% of the text recognised): look at it and say what it is", p, cov.Percent)
		}
		return licenseText{n, string(b)}, strings.Join(ids, " AND "), nil
	}
	return licenseText{}, "", fmt.Errorf("no license file (%s) in %s", strings.Join(licenseFiles, ", "), dir)
}
