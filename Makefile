# mpi5k build. `make` builds bin/, `make deps` installs what the project
# needs on Debian 12 (idempotent), `make test` runs every check CI runs,
# `make demo` runs the workloads with and without the gateways on an idle,
# a lossy and a shared emulated WAN (a few minutes, needs root),
# `make install` (PREFIX, DESTDIR) installs the tools, the library and the
# systemd unit, `make deb` builds a Debian package of the same files.
GO      ?= go
BIN     := bin
# The version: the tag v<VERSION> on the commit it marks; between releases
# v<VERSION>-dev+<commit> (semantic versioning: a pre-release of the next
# one, VERSION naming it).
BASEVERSION := $(shell cat VERSION)
COMMIT  := $(shell git rev-parse --short=12 HEAD 2>/dev/null)
VERSION := $(shell git describe --tags --exact-match --match 'v$(BASEVERSION)' 2>/dev/null || echo v$(BASEVERSION)-dev+$(or $(COMMIT),unknown))
# Dates written into generated files (man pages) are the commit's.
export SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X github.com/mpi5k/mpi5k/internal/cli.Commit=$(COMMIT)
GOFILES := $(shell find . -name '*.go' -not -path './bin/*' 2>/dev/null)
CSRC    := $(wildcard shim/*.c shim/*.h)

.PHONY: all deps test test-unit test-lab check fmt vet bench fuzz demo clean install deb man

all: $(BIN)/libmpi5k.so $(BIN)/mpi5k-gateway $(BIN)/mpi5k bench-bin $(BIN)/bench/floorgw

# The MPI workloads of bench/ (bin/bench/<flavour>/mpi5k-workload).
include bench/workloads.mk

$(BIN)/libmpi5k.so: $(GOFILES) $(CSRC) go.mod
	@mkdir -p $(BIN)
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -trimpath -o $@ ./shim
	@rm -f $(BIN)/libmpi5k.h

$(BIN)/mpi5k-gateway: $(GOFILES) go.mod
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./cmd/mpi5k-gateway

$(BIN)/mpi5k: $(GOFILES) go.mod
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./cmd/mpi5k

# A measuring tool: the simplest gateway the shim can use, a plain relay
# pair for `mpi5k bench --gw-mode floor='--gateway-bin bin/bench/floorgw
# --wan-plaintext'` (bench/floorgw).
$(BIN)/bench/floorgw: $(GOFILES) go.mod
	@mkdir -p $(@D)
	$(GO) build -trimpath -o $@ ./bench/floorgw

# Installs apt packages only when one is missing, then the Go modules.
deps:
	./scripts/deps.sh

fmt:
	gofmt -w $(GOFILES)

# gofmt and go vet must be clean; CI fails otherwise.
check:
	@out=$$(gofmt -l $(GOFILES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Everything CI runs: format/vet, unit tests with the race detector (the
# allocation-counting ones again without it), then the end-to-end tests on
# emulated grids (need root and the apt packages; scripts/e2e.sh says when it
# runs a test again after a lab stall).
test: deps all check
	$(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -v -e /shim -e /e2e)
	$(GO) test -count=1 -run 'Allocs' ./relay ./gateway  # counts allocations: not under -race
	$(GO) test -count=1 -timeout 20m ./shim/...
	GO=$(GO) ./scripts/e2e.sh

bench: all
	$(GO) test -run '^$$' -bench . -benchmem ./sitemap ./header ./relay ./gateway ./tcpinfo ./trace
	$(GO) test -run '^$$' -bench . -benchtime 1x ./shim/test

# Short fuzzing of every fuzz target (the seed corpora run in `make test`).
FUZZTIME ?= 30s
fuzz:
	@for p in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$p 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$p $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$p || exit 1; \
	  done; \
	done

demo: deps all
	./scripts/demo.sh

# Installation layout. The configuration lives in $(SYSCONFDIR)/mpi5k
# whatever the PREFIX; the unit's paths are substituted from these.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib/mpi5k
UNITDIR    ?= $(PREFIX)/lib/systemd/system
DOCDIR     ?= $(PREFIX)/share/doc/mpi5k
MANDIR     ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR ?= $(PREFIX)/share/zsh/vendor-completions
SYSCONFDIR ?= /etc
SUBST = sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
	-e 's|@DOCDIR@|$(DOCDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g'
DOCS := LICENSE README.md docs/operations.md docs/sitemap-format.md

# An existing configuration file is kept: `make install` over an installed
# and configured mpi5k leaves the site's settings alone.
# INSTALL_BIN: where the built files come from (`make deb` installs its
# hardened build).
INSTALL_BIN ?= $(BIN)
install: $(INSTALL_BIN)/libmpi5k.so $(INSTALL_BIN)/mpi5k-gateway $(INSTALL_BIN)/mpi5k
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(UNITDIR) \
		$(DESTDIR)$(SYSCONFDIR)/mpi5k $(DESTDIR)$(DOCDIR) $(DESTDIR)$(MANDIR)/man1 \
		$(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR)
	./scripts/manpages.sh $(INSTALL_BIN) $(DESTDIR)$(MANDIR)/man1 $(VERSION) $(BINDIR)
	chmod 644 $(DESTDIR)$(MANDIR)/man1/*.1
	install -m 644 dist/completion/mpi5k.bash $(DESTDIR)$(BASHCOMPDIR)/mpi5k
	ln -sf mpi5k $(DESTDIR)$(BASHCOMPDIR)/mpi5k-gateway
	ln -sf mpi5k $(DESTDIR)$(BASHCOMPDIR)/mpirun-wrap
	install -m 644 dist/completion/_mpi5k $(DESTDIR)$(ZSHCOMPDIR)/_mpi5k
	install -m 755 $(INSTALL_BIN)/mpi5k $(INSTALL_BIN)/mpi5k-gateway scripts/mpirun-wrap $(DESTDIR)$(BINDIR)/
	install -m 644 $(INSTALL_BIN)/libmpi5k.so $(DESTDIR)$(LIBDIR)/
	install -m 755 dist/keep-warm $(DESTDIR)$(LIBDIR)/
	$(SUBST) dist/mpi5k-gateway.service.in >$(DESTDIR)$(UNITDIR)/mpi5k-gateway.service
	chmod 644 $(DESTDIR)$(UNITDIR)/mpi5k-gateway.service
	for f in gateway.env sites.map.example; do \
	  [ -e $(DESTDIR)$(SYSCONFDIR)/mpi5k/$$f ] || { $(SUBST) dist/$$f >$(DESTDIR)$(SYSCONFDIR)/mpi5k/$$f && \
	    chmod 644 $(DESTDIR)$(SYSCONFDIR)/mpi5k/$$f; } || exit 1; \
	done
	install -m 644 $(DOCS) $(DESTDIR)$(DOCDIR)/
	install -D -m 644 dist/mx.conf $(DESTDIR)$(DOCDIR)/examples/mx.conf
	install -d $(DESTDIR)$(DOCDIR)/examples/prometheus
	install -m 644 dist/prometheus/mpi5k.rules.yml dist/prometheus/prometheus.yml \
		dist/prometheus/grafana-dashboard.json $(DESTDIR)$(DOCDIR)/examples/prometheus/

# The Debian package: the binaries built again as Debian hardens C and Go
# programs (PIE, full RELRO) and stripped, `make install` of them into a
# staging tree with PREFIX=/usr, Debian's copyright file in place of
# LICENSE, then dpkg-deb. The version orders by commit time:
# <VERSION>~git<UTC time>.<commit> between releases (before <VERSION>
# itself, which a tagged commit builds); the maintainer is the commit's author unless
# DEB_MAINTAINER says otherwise.
DEBARCH        = $(shell dpkg --print-architecture)
DEBVERSION     = $(if $(findstring -dev+,$(VERSION)),$(BASEVERSION)~git$(shell TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S).$(shell git rev-parse --short HEAD),$(BASEVERSION))
DEB_MAINTAINER ?= $(shell git log -1 --format='%an <%ae>')
DEB            ?= $(BIN)/mpi5k_$(DEBVERSION)_$(DEBARCH).deb
DEBROOT        := $(BIN)/debroot
NOTICE_PKGS    := ./cmd/mpi5k ./cmd/mpi5k-gateway ./shim
DEBBIN         := $(BIN)/deb
HARDEN_LD      := -linkmode=external -extldflags '-Wl,-z,relro,-z,now'
# The man pages of bin/, in bin/man (make install writes them too).
man: $(BIN)/mpi5k $(BIN)/mpi5k-gateway
	./scripts/manpages.sh $(BIN) $(BIN)/man $(VERSION) $(CURDIR)/$(BIN)

deb: $(GOFILES) $(CSRC) go.mod
	@mkdir -p $(DEBBIN)
	CGO_ENABLED=1 CGO_LDFLAGS='-Wl,-z,relro,-z,now' $(GO) build -buildmode=c-shared -trimpath -o $(DEBBIN)/libmpi5k.so ./shim
	@rm -f $(DEBBIN)/libmpi5k.h
	$(GO) build -buildmode=pie -trimpath -ldflags "$(LDFLAGS) $(HARDEN_LD)" -o $(DEBBIN)/mpi5k-gateway ./cmd/mpi5k-gateway
	$(GO) build -buildmode=pie -trimpath -ldflags "$(LDFLAGS) $(HARDEN_LD)" -o $(DEBBIN)/mpi5k ./cmd/mpi5k
	strip --remove-section=.comment --remove-section=.note $(DEBBIN)/mpi5k $(DEBBIN)/mpi5k-gateway
	strip --remove-section=.comment --remove-section=.note --strip-unneeded $(DEBBIN)/libmpi5k.so
	rm -rf $(DEBROOT)
	$(MAKE) --no-print-directory install INSTALL_BIN=$(DEBBIN) DESTDIR=$(CURDIR)/$(DEBROOT) PREFIX=/usr UNITDIR=/lib/systemd/system
	rm $(DEBROOT)/usr/share/doc/mpi5k/LICENSE
	$(GO) run ./dist/notices $(NOTICE_PKGS) | gzip -9n >$(DEBROOT)/usr/share/doc/mpi5k/THIRD-PARTY-NOTICES.gz
	{ sed '/^Source:/q' dist/copyright; \
	  echo 'Comment: The binaries also contain these Go modules; THIRD-PARTY-NOTICES.gz beside'; \
	  echo ' this file holds their licenses in full:'; \
	  $(GO) run ./dist/notices -list $(NOTICE_PKGS); \
	  sed '1,/^Source:/d' dist/copyright; } >$(DEBROOT)/usr/share/doc/mpi5k/copyright
	chmod 644 $(DEBROOT)/usr/share/doc/mpi5k/copyright
	# dist/changelog, led between releases by an entry for this commit.
	{ if [ '$(DEBVERSION)' != '$(BASEVERSION)' ]; then \
	    printf 'mpi5k (%s) unstable; urgency=medium\n\n  * Commit %s, before %s (CHANGELOG.md).\n\n -- %s  %s\n\n' \
	      '$(DEBVERSION)' "$$(git rev-parse --short=12 HEAD)" '$(BASEVERSION)' "$(DEB_MAINTAINER)" "$$(git log -1 --format=%aD)"; fi; \
	  cat dist/changelog; } | gzip -9n >$(DEBROOT)/usr/share/doc/mpi5k/changelog.gz
	install -m 644 CHANGELOG.md $(DEBROOT)/usr/share/doc/mpi5k/
	gzip -9n $(DEBROOT)/usr/share/man/man1/*.1
	rm $(DEBROOT)/usr/share/man/man1/mpirun-wrap.1.gz
	ln -s mpi5k-run.1.gz $(DEBROOT)/usr/share/man/man1/mpirun-wrap.1.gz
	install -d $(DEBROOT)/DEBIAN
	install -m 755 dist/postinst dist/prerm dist/postrm $(DEBROOT)/DEBIAN/
	printf '/etc/mpi5k/gateway.env\n/etc/mpi5k/sites.map.example\n' >$(DEBROOT)/DEBIAN/conffiles
	mkdir -p $(DEBBIN)/shlibs/debian && printf 'Source: mpi5k\n\nPackage: mpi5k\nArchitecture: any\n' >$(DEBBIN)/shlibs/debian/control
	cd $(DEBBIN)/shlibs && dpkg-shlibdeps -O ../mpi5k ../mpi5k-gateway ../libmpi5k.so 2>/dev/null | sed -n 's/^shlibs:Depends=//p' >../depends
	sed -e 's|@VERSION@|$(DEBVERSION)|' -e 's|@ARCH@|$(DEBARCH)|' -e 's|@MAINTAINER@|$(DEB_MAINTAINER)|' \
	  -e "s|@DEPENDS@|$$(cat $(DEBBIN)/depends)|" \
	  -e "s|@SIZE@|$$(du -sk --exclude=DEBIAN $(DEBROOT) | cut -f1)|" dist/control.in >$(DEBROOT)/DEBIAN/control
	cd $(DEBROOT) && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | xargs -0 md5sum >DEBIAN/md5sums
	dpkg-deb --root-owner-group -Zxz --build $(DEBROOT) $(DEB)

clean:
	rm -rf $(BIN)
