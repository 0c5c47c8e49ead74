#!/bin/bash
# Installs what Hull's build, demo and tests need on Debian 12, as root.
# Idempotent: installs only what is missing.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in make gcc libc6-dev qemu-system-x86 protobuf-compiler busybox-static dpkg-dev xz-utils cpio iproute2 procps \
	containerd runc containernetworking-plugins util-linux; do
	have_pkg "$p" || need+=("$p")
done
# Hull's guest kernel (hack/build-kernel.sh): only when a build is needed.
if [ "${1:-}" = kernel ]; then
	for p in linux-source-6.1 gcc make libc6-dev flex bison bc libelf-dev libssl-dev xz-utils patch; do
		have_pkg "$p" || need+=("$p")
	done
fi
# Hull's QEMU (hack/build-qemu.sh): only when a build is needed (gcc, make
# and dpkg-dev are in the list above).
if [ "${1:-}" = qemu ]; then
	for p in ninja-build meson python3 pkg-config libglib2.0-dev libpixman-1-dev libseccomp-dev \
		libfdt-dev libcap-ng-dev libattr1-dev; do
		have_pkg "$p" || need+=("$p")
	done
fi
if ((${#need[@]})); then
	echo "installing: ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
	export PATH=/usr/local/go/bin:$PATH
fi
if ! command -v go >/dev/null; then
	echo "Go 1.26 or newer is required (expected at /usr/local/go)" >&2
	exit 1
fi
