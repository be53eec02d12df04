package sitemap

import "testing"

func TestGrid5000Site(t *testing.T) {
	for name, want := range map[string]string{
		"graphene-12.nancy.grid5000.fr":               "nancy",
		"graphene-12.nancy.grid5000.fr.":              "nancy",
		"paravance-71.rennes.grid5000.fr":             "rennes",
		"node-1.site1":                                "site1",
		"node-12.site2":                               "site2",
		"graphene-12-kavlan-4.nancy.grid5000.fr":      "nancy",
		"graphene-12-eth1.nancy.grid5000.fr":          "nancy",
		"graphene-12-ib0.nancy.grid5000.fr":           "nancy",
		"graphene-12-eth1-kavlan-4.nancy.grid5000.fr": "nancy",
		"graphene-12-ipv6.nancy.grid5000.fr":          "nancy",
		"chifflot2-3.lille.grid5000.fr":               "lille",
		"Graphene-12.Nancy.grid5000.fr":               "Nancy",

		"gw.site1":                            "", // no -<n>
		"graphene-12":                         "", // bare name
		"graphene":                            "",
		"frontend.nancy.grid5000.fr":          "",
		"graphene.nancy.grid5000.fr":          "", // no number
		"graphene-.nancy.grid5000.fr":         "",
		"graphene-x.nancy.grid5000.fr":        "",
		"-12.nancy.grid5000.fr":               "",
		"12-3.nancy.grid5000.fr":              "", // cluster must start with a letter
		"graphene-12-kavlan.nancy.fr":         "", // kavlan without its number
		"graphene-12-kavlan-x.nancy.fr":       "",
		"graphene-12-foo.nancy.grid5000.fr":   "", // unknown suffix
		"graphene-12--eth1.nancy.grid5000.fr": "",
		"graphene-12.1nancy.grid5000.fr":      "", // site must start with a letter
		"graphene-12..grid5000.fr":            "",
		"graphene-12.":                        "",
		"graphene-12.nancy..fr":               "",
		"10.0.0.1":                            "",
		"::1":                                 "",
		"":                                    "",
		"graphene-12.na_ncy.grid5000.fr":      "",
		"graphene-12.nancy grid5000.fr":       "",
	} {
		got, ok := Grid5000Site(name)
		if ok != (want != "") || got != want {
			t.Errorf("Grid5000Site(%q) = %q, %v; want %q", name, got, ok, want)
		}
	}
}
