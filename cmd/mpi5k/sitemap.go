package main

import (
	"fmt"
	"io"
	"net/netip"
	"os"

	"github.com/mpi5k/mpi5k/internal/cli"
	"github.com/mpi5k/mpi5k/sitemap"
	"github.com/spf13/pflag"
)

func init() {
	register("sitemap", "check a site map file, print it canonically, look addresses up", func(args []string) int {
		return runSitemap(args, os.Stdout, os.Stderr)
	})
}

const sitemapUsage = `usage: mpi5k sitemap check [--canonical] FILE
       mpi5k sitemap lookup FILE ADDR|HOST...

check    validate FILE (docs/sitemap-format.md); print every error as file:line: reason
         and exit 1, or a summary (--canonical: the canonical text) and exit 0.
lookup   print the site of each address or host name: an explicit host of the map,
         an address in a site's nets, or else a name by the Grid'5000 convention.
`

func runSitemap(args []string, stdout, stderr io.Writer) int {
	if _, _, code, done := cli.Subcommand(args, sitemapUsage, stdout, stderr); done {
		return code
	}
	if args[0] != "check" && args[0] != "lookup" {
		fmt.Fprintf(stderr, "mpi5k sitemap: unknown subcommand %q (want check or lookup)\nRun 'mpi5k sitemap --help' for usage.\n", args[0])
		return cli.ExitUsage
	}
	fs := pflag.NewFlagSet("mpi5k sitemap "+args[0], pflag.ContinueOnError)
	canonical := fs.Bool("canonical", false, "print the map in canonical form")
	cmd := cli.Command{Name: "mpi5k sitemap " + args[0], Stdout: stdout, Stderr: stderr, Help: func(w io.Writer) {
		fmt.Fprint(w, sitemapUsage, "\nflags:\n", fs.FlagUsages(), cli.ExitStatusHelp(false))
	}}
	if code, done := cmd.Parse(fs, args[1:]); done {
		return code
	}
	rest := fs.Args()
	switch args[0] {
	case "check":
		if len(rest) != 1 {
			return cmd.Usagef("want one map FILE, got %d arguments", len(rest))
		}
		m, err := sitemap.Load(rest[0])
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		if *canonical {
			m.WriteTo(stdout)
			return 0
		}
		for _, s := range m.Sites() {
			fmt.Fprintf(stdout, "site %-12s id=%-3d lan=%s wan=%s nets=%d hosts=%d\n",
				s.Name, s.ID, s.LAN, s.WAN, len(s.Nets), len(s.Hosts))
		}
		return 0
	case "lookup":
		if len(rest) < 2 {
			return cmd.Usagef("want a map FILE and at least one ADDR or HOST")
		}
		m, err := sitemap.Load(rest[0])
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		status := 0
		for _, q := range rest[1:] {
			if site, how, ok := lookupSite(m, q); ok {
				fmt.Fprintf(stdout, "%s\t%s\t(%s)\n", q, site, how)
			} else {
				fmt.Fprintf(stdout, "%s\t-\t(in no site)\n", q)
				status = 1
			}
		}
		return status
	}
	panic("unreachable: subcommand checked above")
}

func lookupSite(m *sitemap.Map, q string) (site, how string, ok bool) {
	if a, err := netip.ParseAddr(q); err == nil {
		if s, ok := m.Lookup(a); ok {
			if g, isGW := m.GatewaySite(a); isGW && g == s {
				return s.Name, "address, gateway", true
			}
			return s.Name, "address", true
		}
		if g, ok := m.GatewaySite(a); ok {
			return g.Name, "gateway address outside the site's nets", true
		}
		return "", "", false
	}
	if h, ok := m.Host(q); ok {
		return h.Site, "host", true
	}
	if s, ok := sitemap.Grid5000Site(q); ok {
		if _, known := m.Site(s); known {
			return s, "Grid'5000 name", true
		}
		return s, "Grid'5000 name, site not in the map", true
	}
	return "", "", false
}
