# sandboxd: `make run` builds everything and starts the server; `make test` runs all tests.
# Needs root (network namespaces, mounts, cgroups) and, for the first image build, debootstrap.

GO      ?= go
BIN     := $(CURDIR)/bin
GOFLAGS := -trimpath
export CGO_ENABLED := 0

.PHONY: all build image run test test-unit bench clean-leftovers fmt

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build $(GOFLAGS) -o $(BIN)/sandboxd ./cmd/sandboxd
	$(GO) build $(GOFLAGS) -o $(BIN)/sandboxd-agent ./cmd/sandboxd-agent
	@# runsc from the gVisor version pinned in go.mod; static (CGO_ENABLED=0) or it cannot start.
	$(GO) build $(GOFLAGS) -o $(BIN)/runsc gvisor.dev/gvisor/runsc

root-check:
	@if [ "$$(id -u)" != 0 ]; then echo "sandboxd needs root (network namespaces, mounts, cgroups): run 'sudo make $(MAKECMDGOALS)'" >&2; exit 1; fi

image: build root-check
	$(BIN)/sandboxd image

run: build root-check
	$(BIN)/sandboxd serve $(ARGS)

test: build root-check image
	$(GO) vet ./...
	@# The scrubber's fuzz target, bounded on every run. A count, not a duration:
	@# Go 1.26's coordinator can fail a duration run at its deadline with no
	@# crasher (go.dev/issue/75804, fixed in 1.27).
	$(GO) test -run '^$$' -fuzz FuzzScrub -fuzztime 200000x -fuzzminimizetime 5s ./streams/scrub/
	SANDBOXD_BIN=$(BIN) $(GO) test -count=1 -timeout 40m ./...

test-unit:
	$(GO) vet ./...
	$(GO) test -count=1 -short ./...

bench: build root-check image
	SANDBOXD_BIN=$(BIN) $(GO) test -count=1 -run '^$$' -bench . -benchtime 20x -timeout 30m ./server/
	$(GO) test -count=1 -run '^$$' -bench Scrub -benchtime 2s ./streams/scrub/

fmt:
	gofmt -w $$(git ls-files '*.go')
