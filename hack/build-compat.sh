#!/bin/bash
# Builds the other containerd versions and the CRI conformance suite that
# `make test` runs Hull against, from the Go module proxy, into a cache kept
# outside the clone (one directory per version, so a second run skips the
# build):
#   $HULL_CACHE/containerd-1.7.35/bin/{containerd,ctr,containerd-shim-runc-v2}
#   $HULL_CACHE/containerd-2.2.9/bin/{containerd,ctr,containerd-shim-runc-v2}
#   $HULL_CACHE/containerd-2.4.2/bin/{containerd,ctr,containerd-shim-runc-v2}
#   $HULL_CACHE/critest-1.37.0/bin/critest
# A build that fails fails the script (and `make test`): never a skip.
# Usage: build-compat.sh [containerd-1.7|containerd-2.2|containerd-2.4|critest ...] (all by default)
set -euo pipefail

CACHE=${HULL_CACHE:-/var/cache/hull}
CONTAINERD17=${HULL_CONTAINERD17_VERSION:-1.7.35}
CONTAINERD22=${HULL_CONTAINERD22_VERSION:-2.2.9}
CONTAINERD24=${HULL_CONTAINERD24_VERSION:-2.4.2}
CRITOOLS=${HULL_CRITOOLS_VERSION:-1.37.0}
export GOFLAGS=-buildvcs=false CGO_ENABLED=${CGO_ENABLED:-1}
command -v go >/dev/null || export PATH=/usr/local/go/bin:$PATH

# What a build in progress has made (its .tmp directory, a scratch copy):
# removed when the script ends, also when it is killed (make test stops a
# background build that is no longer needed).
scratch=()
trap 'rm -rf "${scratch[@]}"' EXIT
trap 'exit 143' TERM INT

# build NAME DIR CMD...: runs CMD unless DIR/.done exists, timing it; the
# result lands in DIR only when CMD succeeded.
build() {
	local name=$1 dir=$2
	shift 2
	if [ -f "$dir/.done" ]; then
		echo "build-compat: $name cached in $dir"
		return
	fi
	rm -rf "$dir.tmp" && mkdir -p "$dir.tmp/bin"
	scratch+=("$dir.tmp")
	local start=$SECONDS
	echo "build-compat: building $name into $dir"
	if ! "$@" "$dir.tmp"; then
		echo "build-compat: building $name failed" >&2
		rm -rf "$dir.tmp"
		exit 1
	fi
	echo "$((SECONDS - start))" >"$dir.tmp/.build-seconds"
	touch "$dir.tmp/.done"
	rm -rf "$dir" && mv "$dir.tmp" "$dir"
	echo "build-compat: built $name in $((SECONDS - start)) s"
}

# containerd 1.7's go.mod has an exclude directive, so `go install pkg@v`
# refuses it: build inside a copy of the downloaded module instead.
build_containerd17() {
	local out=$1 mod src
	mod=$(go mod download -json "github.com/containerd/containerd@v$CONTAINERD17" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[ -d "$mod" ] || { echo "go mod download github.com/containerd/containerd@v$CONTAINERD17: no module directory" >&2; return 1; }
	src=$(mktemp -d)
	scratch+=("$src")
	local rc=0
	(cp -r "$mod/." "$src" && chmod -R u+w "$src" && cd "$src" &&
		nice -n 10 go build -tags no_btrfs -o "$out/bin/" ./cmd/containerd ./cmd/ctr ./cmd/containerd-shim-runc-v2) || rc=$?
	rm -rf "$src"
	return $rc
}

# build_containerd2 VERSION OUT: a 2.x containerd, ctr and runc shim.
build_containerd2() {
	local v=$1 out=$2
	GOBIN=$out/bin nice -n 10 go install -tags no_btrfs \
		"github.com/containerd/containerd/v2/cmd/containerd@v$v" \
		"github.com/containerd/containerd/v2/cmd/ctr@v$v" \
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@v$v"
}

# 2.2 is the last 2.x whose `start` takes its parameters as arguments, as
# 1.x does; 2.3+ hands them to the shim on stdin, which Debian's 1.6 runc
# shim misreads: each runc baseline uses its own version's shim.
build_containerd22() { build_containerd2 "$CONTAINERD22" "$1"; }
build_containerd24() { build_containerd2 "$CONTAINERD24" "$1"; }

# critest is cri-tools' ginkgo suite compiled as a test binary: a scratch
# module requires cri-tools and `go test -c` builds its cmd/critest.
build_critest() {
	local out=$1 src
	src=$(mktemp -d)
	scratch+=("$src")
	cat >"$src/go.mod" <<MOD
module hull.local/critest

go 1.24
MOD
	cat >"$src/tools.go" <<'GO'
package critest

import (
	_ "sigs.k8s.io/cri-tools/cmd/critest"
	_ "sigs.k8s.io/cri-tools/pkg/validate"
)
GO
	local rc=0
	(cd "$src" && go get "sigs.k8s.io/cri-tools@v$CRITOOLS" && go mod tidy &&
		nice -n 10 go test -c -o "$out/bin/critest" sigs.k8s.io/cri-tools/cmd/critest) || rc=$?
	rm -rf "$src"
	return $rc
}

want=("$@")
((${#want[@]})) || want=(containerd-1.7 containerd-2.2 containerd-2.4 critest)
for w in "${want[@]}"; do
	case $w in
	containerd-1.7) build "containerd $CONTAINERD17" "$CACHE/containerd-$CONTAINERD17" build_containerd17 ;;
	containerd-2.2) build "containerd $CONTAINERD22" "$CACHE/containerd-$CONTAINERD22" build_containerd22 ;;
	containerd-2.4) build "containerd $CONTAINERD24" "$CACHE/containerd-$CONTAINERD24" build_containerd24 ;;
	critest) build "critest $CRITOOLS" "$CACHE/critest-$CRITOOLS" build_critest ;;
	*) echo "build-compat: unknown target $w" >&2; exit 2 ;;
	esac
done
