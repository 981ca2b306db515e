# vipd — the one entry point for building and testing.
#
#   make demo   boot the test guest and watch vipd balance real traffic
#   make test   every test: unit, root (network namespaces), fuzz, real kernel
#
# Everything runs as root on a Debian-like host with Go; what else the
# tests need (iptables, ipset, qemu, Debian's kernel) is installed on demand.

GO        ?= go
BIN       ?= bin
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo devel)
LDFLAGS   := -s -w -X main.version=$(VERSION)
# grpcnotrace keeps gRPC (linked by GoBGP, never served) from importing
# golang.org/x/net/trace, whose html/template defeats the linker's dead
# method elimination: 40 MB instead of 70.
TAGS      ?= grpcnotrace
# Fuzz budgets are counts of executions, not durations: Go before 1.27
# can fail a -fuzztime duration at its deadline with "context deadline
# exceeded" and no crasher (go.dev/issue/75804), as FuzzIpvsadm did. The
# minimization of each new input is bounded too: by default it may run a
# minute, during which the fuzzer makes no progress. Sized for 5-15 s each
# on 2 cores; FUZZN scales them (FUZZN=10 for a longer run).
FUZZN     ?= 1
FUZZMIN   ?= 100x
# Packages whose root-only tests need the real kernel (ip_vs, dummy): their
# test binaries also run inside the qemu guest.
GUEST_PKGS ?= ./kernel/ipvs ./kernel/link ./kernel/sysctl ./kernel/iptables ./kernel/arp

export CGO_ENABLED := 0

.PHONY: all build test unit fuzz e2e vm-selftest systemd-test demo lint check bench deps k8s-rig install deb clean

all: build

## build: vipd; vipd-kubernetes, the Kubernetes provider vipd runs beside
## itself when [kubernetes] is enabled; and vipd-bgp, the BGP speaker it
## runs when [bgp] is (without cgo: they drop the capabilities of every
## thread).
build:
	$(GO) build -trimpath -tags '$(TAGS)' -ldflags '$(LDFLAGS)' -o $(BIN)/vipd ./cmd/vipd
	$(GO) build -trimpath -tags '$(TAGS)' -ldflags '$(LDFLAGS)' -o $(BIN)/vipd-kubernetes ./cmd/vipd-kubernetes
	$(GO) build -trimpath -tags '$(TAGS)' -ldflags '$(LDFLAGS)' -o $(BIN)/vipd-bgp ./cmd/vipd-bgp

## test: the whole suite; CI runs exactly this (.ci/run).
test: lint unit fuzz e2e vm-selftest systemd-test

## deps: host packages the root tests use.
deps:
	test/deps.sh

## k8s-rig: build (once per version) the etcd and kube-apiserver the
## Kubernetes source's tests run against (test/k8s/rig.sh; cached in
## /var/cache/vipd-k8s).
k8s-rig:
	test/k8s/rig.sh >/dev/null

## unit: pure unit tests, plus root tests in private network namespaces
## (and against a real API server).
unit: deps k8s-rig
	$(GO) test -count=1 ./...

## fuzz: short, bounded runs of the parsers' fuzz targets (the config
## file, vipd import's keepalived.conf and ipvsadm -Sn readers, and the
## wires from the Kubernetes provider and the BGP speaker).
fuzz:
	$(GO) test -count=1 -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $$((100000 * $(FUZZN)))x -fuzzminimizetime $(FUZZMIN) ./config
	$(GO) test -count=1 -run '^$$' -fuzz '^FuzzKeepalived$$' -fuzztime $$((100000 * $(FUZZN)))x -fuzzminimizetime $(FUZZMIN) ./migrate
	$(GO) test -count=1 -run '^$$' -fuzz '^FuzzIpvsadm$$' -fuzztime $$((40000 * $(FUZZN)))x -fuzzminimizetime $(FUZZMIN) ./migrate
	$(GO) test -count=1 -run '^$$' -fuzz '^FuzzMetalLB$$' -fuzztime $$((20000 * $(FUZZN)))x -fuzzminimizetime $(FUZZMIN) ./migrate
	$(GO) test -count=1 -run '^$$' -fuzz '^FuzzWire$$' -fuzztime $$((100000 * $(FUZZN)))x -fuzzminimizetime $(FUZZMIN) ./source/process
	$(GO) test -count=1 -run '^$$' -fuzz '^FuzzRead$$' -fuzztime $$((50000 * $(FUZZN)))x -fuzzminimizetime $(FUZZMIN) ./ha/bgpproc

## e2e: the end-to-end suite in a qemu guest with Debian's kernel.
e2e: deps
	VIPD_GUEST_PKGS="$(GUEST_PKGS)" test/vm/e2e.sh

## vm-selftest: the rig proves its failure paths fail (a wrong expectation,
## a kernel panic, a hang, a faked exit marker, a failed boot).
vm-selftest:
	test/vm/selftest.sh

## systemd-test: the .deb (make deb) and its unit under Debian 12's systemd
## in a qemu guest: dpkg -i, systemctl start/reload/stop, a watchdog
## restart, the exec check's user, the unit's writable paths
## (test/vm/systemd-test.sh; the guest's root image is built on first use).
systemd-test:
	test/vm/systemd-test.sh

## demo: boot the guest, run vipd with examples/demo.toml, send traffic.
demo:
	test/vm/demo.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

## check: lint and validate every example configuration.
check: lint build
	@for f in examples/*.toml; do $(BIN)/vipd check $$f || exit 1; done

## bench: Go benchmarks of the planner, the config parser and the
## daemon's reload, the status page's cost with Chromium holding it open
## at 10,000 x 10 (TestStatusPageCPU), then vipd against ipvsadm -R and keepalived in one
## guest boot (test/vm/bench.sh; VIPD_BENCH_SIZES etc. size it; ~10-20
## minutes), then health checks at scale: vipd alone on the host and
## vipd against keepalived's checker in one guest boot
## (test/vm/bench-health.sh; VIPD_HEALTHBENCH_*), then vipd against
## kube-proxy (IPVS mode) with LoadBalancer
## Services of a real API server in another (test/vm/bench-k8s.sh;
## VIPD_BENCH_K8S_SIZES). Not part of make test.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./lb ./config ./agent ./monitor/metrics ./monitor/status ./monitor/statuspage ./cmd/vipd
	VIPD_PAGE_CPU=1 $(GO) test -count=1 -v -timeout 30m -run '^TestStatusPageCPU$$' ./cmd/vipd
	test/vm/bench.sh
	test/vm/bench-ha.sh
	test/vm/bench-health.sh
	test/vm/bench-k8s.sh

PREFIX  ?= /usr
DESTDIR ?=
NFPM    ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2

## install: the binaries (vipd-kubernetes and vipd-bgp beside vipd, where
## vipd looks for them), the systemd unit, module and sysctl drop-ins, and
## an example configuration (an existing one is kept).
install: build
	install -D -m 0755 $(BIN)/vipd $(DESTDIR)$(PREFIX)/sbin/vipd
	install -D -m 0755 $(BIN)/vipd-kubernetes $(DESTDIR)$(PREFIX)/sbin/vipd-kubernetes
	install -D -m 0755 $(BIN)/vipd-bgp $(DESTDIR)$(PREFIX)/sbin/vipd-bgp
	install -D -m 0644 systemd/vipd.service $(DESTDIR)/lib/systemd/system/vipd.service
	install -D -m 0644 systemd/modules-load.conf $(DESTDIR)$(PREFIX)/lib/modules-load.d/vipd.conf
	install -D -m 0644 systemd/sysctl.conf $(DESTDIR)$(PREFIX)/lib/sysctl.d/60-vipd.conf
	install -D -m 0644 systemd/tmpfiles.conf $(DESTDIR)$(PREFIX)/lib/tmpfiles.d/vipd.conf
	test -e $(DESTDIR)/etc/vipd/vipd.toml || install -D -m 0640 examples/minimal.toml $(DESTDIR)/etc/vipd/vipd.toml
	@echo "installed; edit /etc/vipd/vipd.toml, then: systemctl daemon-reload && systemctl enable --now vipd"

## deb: a Debian package (bin/vipd_VERSION_amd64.deb), built with nfpm.
deb: build
	VIPD_VERSION=$$(echo $(VERSION) | sed -E 's/^v//; /^[0-9]+\.[0-9]/!s/^/0.0.0~git/') $(NFPM) package --config systemd/nfpm.yaml --packager deb --target $(BIN)/

clean:
	rm -rf $(BIN)
