# sandboxd: `make run` builds everything and starts the server; `make test` runs all tests.
# Needs root (network namespaces, mounts, cgroups); both install the host packages they
# need (configs/host/packages.txt) when a command is missing.

# sudo's secure_path often lacks Go's directory: fall back to where Go's
# installer puts it.
GO      ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
BIN     := $(CURDIR)/bin
GOFLAGS := -trimpath
export CGO_ENABLED := 0

.PHONY: all build web root-check host-packages host-sysctl image run test test-hardening fuzz test-unit bench install install-files fmt

all: build

build: web
	@mkdir -p $(BIN)
	$(GO) build $(GOFLAGS) -o $(BIN)/sandboxd ./cmd/sandboxd
	$(GO) build $(GOFLAGS) -o $(BIN)/sandboxd-agent ./cmd/sandboxd-agent
	$(GO) build $(GOFLAGS) -o $(BIN)/sbx ./cmd/sbx
	@# runsc from the gVisor version pinned in go.mod; static (CGO_ENABLED=0) or it cannot start.
	$(GO) build $(GOFLAGS) -o $(BIN)/runsc gvisor.dev/gvisor/runsc

# The web console (web/): npm packages from the lockfile, bundled by esbuild
# into web/dist, which go:embed puts in the binary. dist is committed too and
# the build is reproducible: web's TestDistInSync rebuilds it and compares.
web: web/node_modules/.package-lock.json
	cd web && node build.mjs

web/node_modules/.package-lock.json: web/package.json web/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "npm is missing: 'sudo make host-packages' installs it (configs/host/packages.txt)" >&2; exit 1; }
	cd web && npm ci --no-audit --no-fund --loglevel=error

root-check:
	@if [ "$$(id -u)" != 0 ]; then echo "sandboxd needs root (network namespaces, mounts, cgroups): run 'sudo make $(MAKECMDGOALS)'" >&2; exit 1; fi

# Installs the Debian package of every command in configs/host/packages.txt
# that is not on PATH (a fresh machine lacks debootstrap, for one).
host-packages: root-check
	@need=$$(awk '!/^#/ && NF == 2 {print $$1, $$2}' configs/host/packages.txt | \
		while read -r cmd pkg; do command -v "$$cmd" >/dev/null 2>&1 || echo "$$pkg"; done | sort -u | tr '\n' ' '); \
	if [ -n "$$need" ]; then \
		echo "installing host packages: $$need"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need; \
	fi

# Every host thread takes a process id and an idle sandbox holds about 30:
# limits.maxSandboxes (1,000) needs more than the kernel's old default
# kernel.pid_max of 32,768. Raised (never lowered) to 4,194,304, systemd's
# default on 64-bit hosts, and kept in /etc/sysctl.d; sandboxd doctor says
# what is left when the kernel refuses.
host-sysctl: root-check
	@cur=$$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 0); \
	if [ "$$cur" -lt 4194304 ]; then \
		echo "raising kernel.pid_max from $$cur to 4194304 (/etc/sysctl.d/60-sandboxd.conf)"; \
		mkdir -p /etc/sysctl.d && echo 'kernel.pid_max = 4194304' > /etc/sysctl.d/60-sandboxd.conf; \
		echo 4194304 > /proc/sys/kernel/pid_max || echo "could not raise kernel.pid_max: see sandboxd doctor"; \
	fi

image: root-check host-packages build
	$(BIN)/sandboxd image

run: root-check host-packages host-sysctl build
	$(BIN)/sandboxd serve $(ARGS)

# Random fuzzing of every fuzz target, each bounded by a count of inputs
# (Go 1.26's coordinator can fail a duration run at its deadline with no
# crasher: go.dev/issue/75804), one go test per target (Go fuzzes one at a
# time): request decoders and validators, the workspace path check, the
# egress allowlist, CONNECT targets, HTTP in tunnels and the Git push
# filter, the TLS hello reader, archive extraction, the scrubber. FUZZX
# multiplies every count (make fuzz FUZZX=10). A find is written to the
# package's testdata/fuzz/<target>/ and reproduces with go test -run
# <target>/<name>. Needs root (the archive targets). About 20 minutes on
# 2 cores shared with other work, half of it the scrubber's. Known open
# finds of the scrubber are kept in streams/scrub/testdata/fuzz-open.
FUZZX ?= 1
FUZZ  := \
	./streams/scrub/:FuzzScrub:200000 \
	./server/:FuzzDecodeRequest:20000 \
	./server/:FuzzValidators:20000 \
	./server/:FuzzContentDisposition:20000 \
	./server/workspace/:FuzzWorkspacePath:20000 \
	./server/credits/:FuzzParseMilli:50000 \
	./server/portal/:FuzzParse:50000 \
	./egress/:FuzzNormalizeHost:50000 \
	./egress/:FuzzAllowlistRule:50000 \
	./egress/:FuzzConnectTarget:50000 \
	./egress/:FuzzTunnelHTTP:50000 \
	./egress/:FuzzTunnelSniffed:50000 \
	./egress/:FuzzCheckPush:50000 \
	./egress/:FuzzClientHello:50000 \
	./runsc/:FuzzCPUList:50000 \
	./runsc/archive/:FuzzTarReader:50000 \
	./runsc/archive/:FuzzUnpack:2000 \
	./runsc/archive/:FuzzUnpackEntries:3000
fuzz: root-check
	@set -e; for t in $(FUZZ); do \
		pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; n=$$(( $${rest#*:} * $(FUZZX) )); \
		echo "fuzz: $$name ($$pkg), $$n inputs"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $${n}x -fuzzminimizetime 5s $$pkg; \
	done

test: root-check host-packages host-sysctl build image
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	@# Every fuzz target runs its seed corpus (with every input it ever
	@# failed on) with the tests below; random fuzzing is make fuzz.
	@# With the race detector, which needs cgo: only the test binaries are
	@# built with it; every shipped binary (build) stays static.
	SANDBOXD_BIN=$(BIN) CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 60m ./...

# The hardening suites at full size (docs/SECURITY.md, docs/BENCHMARKS.md):
# 1,000 idle standard-1 sandboxes then 50 busy ones, fork bombs, memory
# pressure, the warm pool's recovery, the attacks from inside a sandbox
# held a minute each. Bounded in count and time; make test runs the same
# tests at their quick size (12 sandboxes, attacks held 8 s). Figures go
# to test-output/density.json and test-output/attack_inside.json.
test-hardening: root-check host-packages host-sysctl build image
	SANDBOXD_BIN=$(BIN) SANDBOXD_DENSITY=1000 SANDBOXD_HARDENING=1 $(GO) test -count=1 -timeout 150m -v \
		-run 'TestRealDensity|TestRealKillVerified|TestRealPressurePause|TestRealWarmPoolRecovers|TestRealAttackInside|TestHardening' ./server/

# Tests that need neither root nor gVisor (the real ones skip in -short).
test-unit: web
	$(GO) vet ./...
	CGO_ENABLED=1 $(GO) test -race -count=1 -short ./...

bench: root-check host-packages build image
	SANDBOXD_BIN=$(BIN) $(GO) test -count=1 -run '^$$' -bench . -benchtime 20x -timeout 30m ./server/
	$(GO) test -count=1 -run '^$$' -bench Scrub -benchtime 2s ./streams/scrub/
	$(GO) test -count=1 -run '^$$' -bench Sweep -benchtime 10x ./server/sandbox/

# Installs the binaries, the systemd unit and a sample config (kept if
# /etc/sandboxd/sandboxd.yaml exists): sandboxd, runsc and the agent in
# $(PREFIX)/lib/sandboxd (sandboxd finds the other two next to itself),
# sandboxd and sbx on PATH. DESTDIR stages it elsewhere (packaging, tests).
PREFIX  ?= /usr/local
DESTDIR ?=
LIBDIR  := $(DESTDIR)$(PREFIX)/lib/sandboxd
install: root-check host-packages host-sysctl build install-files
	@echo "installed; start it with: sudo systemctl enable --now sandboxd (check the machine first: sudo sandboxd doctor)"

# What install copies, from an existing build (cmd/sandboxd's test stages it in a DESTDIR).
install-files:
	install -d $(LIBDIR) $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/doc/sandboxd \
		$(DESTDIR)/etc/sandboxd $(DESTDIR)/etc/systemd/system
	install -m 0755 $(BIN)/sandboxd $(BIN)/sandboxd-agent $(BIN)/runsc $(LIBDIR)/
	ln -sfn ../lib/sandboxd/sandboxd $(DESTDIR)$(PREFIX)/bin/sandboxd
	install -m 0755 $(BIN)/sbx $(DESTDIR)$(PREFIX)/bin/sbx
	sed 's|/usr/local/|$(PREFIX)/|g' configs/install/sandboxd.service > $(DESTDIR)/etc/systemd/system/sandboxd.service
	chmod 0644 $(DESTDIR)/etc/systemd/system/sandboxd.service
	@if [ -e $(DESTDIR)/etc/sandboxd/sandboxd.yaml ]; then echo "kept $(DESTDIR)/etc/sandboxd/sandboxd.yaml"; \
	else install -m 0644 configs/install/sandboxd.yaml $(DESTDIR)/etc/sandboxd/sandboxd.yaml; fi
	install -m 0644 README.md docs/SECURITY.md configs/sizes.yaml configs/plans.yaml configs/egress.yaml $(DESTDIR)$(PREFIX)/share/doc/sandboxd/
	install -m 0644 configs/sandboxd.yaml $(DESTDIR)$(PREFIX)/share/doc/sandboxd/sandboxd.defaults.yaml
	@if [ -z "$(DESTDIR)" ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

fmt:
	gofmt -w $$(git ls-files '*.go')
