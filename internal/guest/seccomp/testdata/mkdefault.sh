#!/bin/sh
# mkdefault.sh writes containerd-default.json: the OCI seccomp profile that
# containerd v1.7.35's contrib/seccomp.DefaultProfile gives a CRI container
# with RuntimeDefault and CRI's default capabilities, on amd64. Its package
# imports containerd/oci, which does not build against this module's
# runtime-spec, so the profile code is built in a scratch module from the
# module cache. Run from this directory: sh mkdefault.sh
set -eu
src=$(go list -m -f '{{.Dir}}' github.com/containerd/containerd)/contrib/seccomp
out=$(pwd)/containerd-default.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/seccomp/kernelversion"
cp "$src/seccomp_default.go" "$tmp/seccomp/"
cp "$src/kernelversion/kernel_linux.go" "$tmp/seccomp/kernelversion/"
chmod -R u+w "$tmp"
sed -i 's#github.com/containerd/containerd/contrib/seccomp/kernelversion#mkdefault/seccomp/kernelversion#' "$tmp/seccomp/seccomp_default.go"
cat >"$tmp/main.go" <<'GO'
package main

import (
	"encoding/json"
	"os"

	"mkdefault/seccomp"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func main() {
	caps := []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
		"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
		"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	}
	s := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}}
	b, err := json.MarshalIndent(seccomp.DefaultProfile(s), "", "  ")
	if err != nil {
		panic(err)
	}
	os.Stdout.Write(append(b, '\n'))
}
GO
rs=$(go list -m -f '{{.Version}}' github.com/opencontainers/runtime-spec)
xs=$(go list -m -f '{{.Version}}' golang.org/x/sys)
(cd "$tmp" && cat >go.mod <<MOD
module mkdefault

go 1.21

require (
	github.com/opencontainers/runtime-spec $rs
	golang.org/x/sys $xs
)
MOD
GOFLAGS=-mod=mod GOPROXY=off GOSUMDB=off go run . >"$out")
