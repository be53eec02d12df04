package main

import (
	"fmt"
	"io"
	"net/netip"
	"os"

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
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, sitemapUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	fs := pflag.NewFlagSet("sitemap "+args[0], pflag.ContinueOnError)
	fs.SetOutput(stderr)
	canonical := fs.Bool("canonical", false, "print the map in canonical form")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	rest := fs.Args()
	switch args[0] {
	case "check":
		if len(rest) != 1 {
			fmt.Fprint(stderr, sitemapUsage)
			return 2
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
			fmt.Fprint(stderr, sitemapUsage)
			return 2
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
	fmt.Fprintf(stderr, "mpi5k sitemap: unknown subcommand %q\n%s", args[0], sitemapUsage)
	return 2
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
