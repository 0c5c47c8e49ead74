#!/bin/bash
# Installs what Hull's build, demo and tests need on Debian 12, as root.
# Idempotent: installs only what is missing.
#   hack/install-deps.sh [kernel] [qemu]
# kernel, qemu: also what building Hull's guest kernel or QEMU needs
# (hack/build-kernel.sh, hack/build-qemu.sh ask for it on a cache miss).
# Runs may overlap (make test builds the kernel and QEMU side by side):
# apt runs one at a time, under a lock.
set -euo pipefail

have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
wanted=(make gcc libc6-dev qemu-system-x86 protobuf-compiler busybox-static dpkg-dev xz-utils cpio iproute2 procps
	containerd runc containernetworking-plugins util-linux)
for extra in "$@"; do
	case $extra in
	kernel) wanted+=(linux-source-6.1 flex bison bc libelf-dev libssl-dev patch) ;;
	qemu) wanted+=(ninja-build meson python3 pkg-config libglib2.0-dev libpixman-1-dev libseccomp-dev
		libfdt-dev libcap-ng-dev libattr1-dev) ;;
	*) echo "install-deps: unknown list $extra (kernel, qemu)" >&2; exit 2 ;;
	esac
done
missing() {
	need=()
	for p in "${wanted[@]}"; do
		have_pkg "$p" || need+=("$p")
	done
	((${#need[@]}))
}

if missing; then
	exec 8>/run/lock/hull-install-deps.lock
	flock 8
	if missing; then # another run may have installed them meanwhile
		echo "installing: ${need[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt_install() { apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
		# Package lists refreshed in the last hour (by an earlier run) are
		# used as they are; an install that fails with them updates first.
		if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -60 2>/dev/null)" ] || ! apt_install 2>/dev/null; then
			apt-get update -qq
			apt_install
		fi
	fi
	exec 8>&-
fi

if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
	export PATH=/usr/local/go/bin:$PATH
fi
if ! command -v go >/dev/null; then
	echo "Go 1.26 or newer is required (expected at /usr/local/go)" >&2
	exit 1
fi
