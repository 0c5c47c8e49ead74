# Hull's build. Every target that needs root says so; `make test` and
# `make demo` install what is missing first (Debian 12, as root).
SHELL := /bin/bash
# out/qemu/bin holds Hull's QEMU (make qemu): first, so that what make runs
# (tests, benches) finds it as an installed Hull does (docs/qemu.md).
export PATH := /usr/local/go/bin:$(CURDIR)/.bin:$(CURDIR)/out/qemu/bin:$(PATH)
export GOFLAGS ?= -buildvcs=false

OUT    := $(CURDIR)/out
BIN    := $(OUT)/bin
# The shim built with the hull_failpoints tag: it honours the
# io.hull.failpoint annotation (fault-injection tests only, never installed).
BIN_FAILPOINTS := $(OUT)/bin-failpoints
GUEST  := $(OUT)/guest
ROOTFS := $(OUT)/rootfs
PREFIX ?= /usr/local
ASSETS ?= /usr/share/hull

VERSION := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/hull-runtime/hull/internal/cli.Version=$(VERSION) \
           -X github.com/hull-runtime/hull/internal/cli.Commit=$(COMMIT)

PROTOC_GEN_GO_VERSION    := v1.36.12
PROTOC_GEN_TTRPC_VERSION := v1.2.10

.PHONY: all deps build pause shim-failpoints guest guest-debian qemu rootfs install uninstall demo test test-prereqs compat unit vet proto proto-check proto-tools bench bench-density bench-boot bench-net bench-churn clean

all: build

deps:
	@bash hack/install-deps.sh

build:
	go build -ldflags '$(LDFLAGS)' -o $(BIN)/hull ./cmd/hull
	CGO_ENABLED=0 go build -trimpath -ldflags '-s -w $(LDFLAGS)' -o $(BIN)/hull-agent ./cmd/hull-agent
	go build -ldflags '$(LDFLAGS)' -o $(BIN)/containerd-shim-hull-v2 ./cmd/containerd-shim-hull-v2

# The guest's sandbox process (docs/sandbox.md): C, static, no Go runtime
# to start in the guest.
pause: $(BIN)/hull-pause
$(BIN)/hull-pause: guest/pause/pause.c
	@mkdir -p $(BIN)
	gcc -static -Os -s -Wall -Wextra -Werror -o $@ $<

shim-failpoints:
	go build -tags hull_failpoints -ldflags '$(LDFLAGS)' -o $(BIN_FAILPOINTS)/containerd-shim-hull-v2 ./cmd/containerd-shim-hull-v2
	@# containerd 1.6 ignores a CRI runtime's runtime_path when it starts the
	@# shim: a handler with runtime_type io.containerd.hull-failpoints.v2 finds
	@# this name on containerd's PATH instead.
	ln -f $(BIN_FAILPOINTS)/containerd-shim-hull-v2 $(BIN_FAILPOINTS)/containerd-shim-hull-failpoints-v2

# The guest kernel and initramfs. GUEST_KERNEL=hull (the default): Hull's
# own kernel, built from Debian's linux-source-6.1 with guest/kernel/hull.config
# and cached outside the clone by hack/build-kernel.sh (HULL_CACHE, default
# /var/cache/hull); GUEST_KERNEL=debian: Debian's kernel package (apt) and
# the modules the agent loads.
GUEST_KERNEL ?= hull
# Downloads kept outside the clone (Debian's kernel package), as
# hack/build-kernel.sh and hack/build-compat.sh keep their builds.
HULL_CACHE ?= /var/cache/hull
DEBIAN_GUEST_BUILD = $(BIN)/hull guest build --kernel debian --agent $(BIN)/hull-agent --pause $(BIN)/hull-pause --work $(HULL_CACHE)/debian-kernel
guest: build pause
ifeq ($(GUEST_KERNEL),debian)
	$(DEBIAN_GUEST_BUILD) --out $(GUEST)
else
	@# MAKEFLAGS cleared: the kernel's make runs its own -j, not this make's jobserver.
	kdir=$$(MAKEFLAGS= nice -n 10 bash hack/build-kernel.sh) && bash hack/prune-cache.sh "$$kdir" && \
	$(BIN)/hull guest build --kernel hull --kernel-dir "$$kdir" --agent $(BIN)/hull-agent --pause $(BIN)/hull-pause --out $(GUEST)
endif

# Debian's kernel beside Hull's: the fallback `make test` boots once
# (test/e2e TestRunDebianKernel), and make bench-boot's comparison.
guest-debian: build pause
	$(DEBIAN_GUEST_BUILD) --out $(OUT)/guest-debian

# Hull's QEMU (docs/qemu.md): Debian's QEMU source with only the devices
# in guest/qemu/hull-devices.mak, built and cached outside the clone by
# hack/build-qemu.sh (HULL_CACHE), as out/qemu/bin/qemu-system-x86_64-hull.
# hack/prune-cache.sh keeps each of the two caches to the three builds used
# last.
qemu:
	q=$$(nice -n 10 bash hack/build-qemu.sh) && bash hack/prune-cache.sh "$$(dirname "$$q")" && install -C -D -m 0755 "$$q" $(OUT)/qemu/bin/qemu-system-x86_64-hull

rootfs:
	@[ -x $(ROOTFS)/bin/busybox ] || bash hack/busybox-rootfs.sh $(ROOTFS)

install: deps guest qemu
	install -d $(PREFIX)/bin $(ASSETS)
	install -m 0755 $(BIN)/hull $(PREFIX)/bin/hull
	install -m 0755 $(OUT)/qemu/bin/qemu-system-x86_64-hull $(PREFIX)/bin/qemu-system-x86_64-hull
	install -m 0755 $(BIN)/containerd-shim-hull-v2 $(PREFIX)/bin/containerd-shim-hull-v2
	install -m 0644 $(GUEST)/vmlinux $(GUEST)/vmlinuz $(GUEST)/hull-initrd.img $(ASSETS)/

uninstall:
	rm -f $(PREFIX)/bin/hull $(PREFIX)/bin/containerd-shim-hull-v2 $(PREFIX)/bin/qemu-system-x86_64-hull $(ASSETS)/vmlinux $(ASSETS)/vmlinuz $(ASSETS)/hull-initrd.img

# The demo, from a fresh machine: a command in a VM with `hull run`, then
# a Kubernetes-style pod of two containers through CRI on a private
# containerd with Hull as its runtime.
demo: install rootfs
	@bash hack/demo.sh $(ROOTFS)
	go run ./demo/pod --shim-dir $(PREFIX)/bin --kernel $(ASSETS)/vmlinux --initrd $(ASSETS)/hull-initrd.img

# The whole test suite: unit tests, root tests, QEMU end-to-end tests,
# and the check that the generated API code is current.
# What the tests need to find: the binaries, the failpoint shim, the guest
# image, the busybox rootfs; HULL_E2E=1 turns a missing one into a failure.
TEST_ENV = HULL_E2E=1 HULL_BIN=$(BIN)/hull HULL_FAILPOINT_SHIM=$(BIN_FAILPOINTS)/containerd-shim-hull-v2 \
	HULL_TEST_KERNEL=$(GUEST)/vmlinux HULL_TEST_INITRD=$(GUEST)/hull-initrd.img HULL_TEST_ROOTFS=$(ROOTFS) \
	HULL_TEST_PAUSE=$(BIN)/hull-pause HULL_TEST_QEMU=qemu-system-x86_64-hull \
	HULL_TEST_DEBIAN_KERNEL=$(OUT)/guest-debian/vmlinux HULL_TEST_DEBIAN_INITRD=$(OUT)/guest-debian/hull-initrd.img

# hack/test.sh builds test-prereqs (make -j2: the guest kernel and QEMU side
# by side) while containerd 1.7, 2.2 and 2.4 and critest build in the
# background (cached by version in $$HULL_CACHE, /var/cache/hull), then runs
# the suites one package at a time (they boot many VMs each and would starve
# each other of the two cores): CRI, network and critest on each containerd
# version, faults on 1.6 and 2.4; it prints every suite's time and the total.
test: deps
	$(TEST_ENV) bash hack/test.sh

# What the suites need built.
test-prereqs: guest guest-debian qemu rootfs shim-failpoints proto-check vet

# containerd 1.7.35, 2.2.9 and 2.4.2 and critest, from the Go module proxy.
compat:
	bash hack/build-compat.sh

unit:
	go test -count=1 ./...

vet:
	go vet ./...

proto-tools:
	@[ -x .bin/protoc-gen-go ] || GOBIN=$(CURDIR)/.bin go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@[ -x .bin/protoc-gen-go-ttrpc ] || GOBIN=$(CURDIR)/.bin go install github.com/containerd/ttrpc/cmd/protoc-gen-go-ttrpc@$(PROTOC_GEN_TTRPC_VERSION)

proto: proto-tools
	protoc -I api --go_out=paths=source_relative:api --go-ttrpc_out=paths=source_relative:api api/agent/v1/agent.proto

# Fails when the committed generated code differs from a fresh generation.
proto-check: proto-tools
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	protoc -I api --go_out=paths=source_relative:$$tmp --go-ttrpc_out=paths=source_relative:$$tmp api/agent/v1/agent.proto && \
	for f in agent.pb.go agent_ttrpc.pb.go; do \
		diff -u api/agent/v1/$$f $$tmp/agent/v1/$$f || { echo "api/agent/v1/$$f is stale: run make proto and commit" >&2; exit 1; }; \
	done && echo "proto-check: generated code is current"

# Pod start and teardown through CRI, hull and runc side by side (root):
# a private containerd of its own, 10 pods per runtime.
bench: deps guest qemu
	HULL_BIN=$(BIN)/hull HULL_TEST_KERNEL=$(GUEST)/vmlinux HULL_TEST_INITRD=$(GUEST)/hull-initrd.img \
	go run ./bench/pod -pods 20

# 100 idle hull pods (10 started at a time): PSS and idle CPU per pod, and
# the host memory left (issue 12). A benchmark, not part of make test.
bench-density: deps guest qemu
	HULL_BIN=$(BIN)/hull HULL_TEST_KERNEL=$(GUEST)/vmlinux HULL_TEST_INITRD=$(GUEST)/hull-initrd.img \
	go run ./bench/pod -pods 3 -idle $${HULL_DENSITY_PODS:-100} -idle-batch 10

# Issue 5's churn through CRI (root): HULL_CHURN_ROUNDS rounds of
# HULL_CHURN_PODS pods (one container each) created HULL_CHURN_BATCH at a
# time, left idle, removed; pods/min, start/teardown latency, shim CPU, RSS.
bench-churn: deps guest qemu
	HULL_BIN=$(BIN)/hull HULL_TEST_KERNEL=$(GUEST)/vmlinux HULL_TEST_INITRD=$(GUEST)/hull-initrd.img \
	go run ./bench/churn -pods $${HULL_CHURN_PODS:-50} -batch $${HULL_CHURN_BATCH:-10} -rounds $${HULL_CHURN_ROUNDS:-3}

# TCP throughput and request latency between a pod and a peer in the
# test netns: hull tcfilter and macvtap, and runc, in one run (root).
bench-net: deps guest qemu
	HULL_BIN=$(BIN)/hull HULL_TEST_KERNEL=$(GUEST)/vmlinux HULL_TEST_INITRD=$(GUEST)/hull-initrd.img \
	go run ./bench/net

bench-boot: guest guest-debian qemu rootfs
	HULL_BIN=$(BIN)/hull HULL_TEST_KERNEL=$(GUEST)/vmlinux HULL_TEST_INITRD=$(GUEST)/hull-initrd.img \
	HULL_BENCH_DEBIAN_GUEST=$(OUT)/guest-debian HULL_TEST_ROOTFS=$(ROOTFS) go run ./bench/boot -runs 10

clean:
	rm -rf $(OUT)
