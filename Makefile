# mpi5k build. `make` builds bin/, `make deps` installs what the project
# needs on Debian 12 (idempotent), `make test` runs every check CI runs,
# `make demo` runs the with/without-gateway demo on the emulated grid.
GO      ?= go
BIN     := bin
VERSION := $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
GOFILES := $(shell find . -name '*.go' -not -path './bin/*' 2>/dev/null)
CSRC    := $(wildcard shim/*.c shim/*.h)

.PHONY: all deps test test-unit test-lab check fmt vet bench fuzz demo clean

all: $(BIN)/libmpi5k.so $(BIN)/mpi5k-gateway $(BIN)/mpi5k bench-bin

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

clean:
	rm -rf $(BIN)
