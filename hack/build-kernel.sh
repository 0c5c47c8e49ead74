#!/bin/bash
# Builds Hull's guest kernel from Debian's linux-source-6.1, the patches in
# guest/kernel/patches and the config fragment guest/kernel/hull.config,
# reproducibly, into a cache outside the clone keyed by a hash of its inputs;
# prints the directory holding vmlinux, vmlinuz and config. A second run with
# the same inputs builds nothing. vmlinux, the ELF QEMU boots, has no symbol
# table (QEMU reads and sorts one at every start, docs/kernel.md);
# vmlinux.debug beside it has, for gdb and perf.
#
#   hack/build-kernel.sh [fragment]     (root on a fresh machine: installs build deps)
#
# Environment: HULL_CACHE (default /var/cache/hull), HULL_KERNEL_JOBS
# (default nproc).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
frag=$(realpath "${1:-$here/../guest/kernel/hull.config}")
shopt -s nullglob
patches=("$here"/../guest/kernel/patches/*.patch)
shopt -u nullglob
srcpkg=linux-source-6.1
cache=${HULL_CACHE:-/var/cache/hull}/kernel
jobs=${HULL_KERNEL_JOBS:-$(nproc)}

have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
have_pkg "$srcpkg" || bash "$here/install-deps.sh" kernel >&2
version=$(dpkg-query -W -f='${Version}' "$srcpkg")
tarball=$(dpkg -L "$srcpkg" | grep -E '^/usr/src/linux-source-[0-9.]+\.tar\.xz$' | head -n1)
[ -n "$tarball" ] || { echo "build-kernel: $srcpkg $version ships no /usr/src/linux-source-*.tar.xz" >&2; exit 1; }

# The key: the fragment, the patches, this script (the recipe) and the
# source version.
patched=$(cat /dev/null "${patches[@]}" | sha256sum | cut -c1-16) # none: the hash of nothing
key=$( { cat "$frag"; echo "patches=$patched"; cat "$0"; echo "$srcpkg=$version"; } | sha256sum | cut -c1-16)
dest=$cache/$key
if [ -s "$dest/vmlinux" ] && [ -s "$dest/vmlinuz" ]; then
	echo "build-kernel: cached $dest ($srcpkg $version)" >&2
	echo "$dest"
	exit 0
fi
bash "$here/install-deps.sh" kernel >&2

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9 # one build at a time: they share the source and build trees
if [ -s "$dest/vmlinux" ] && [ -s "$dest/vmlinuz" ]; then
	echo "$dest"
	exit 0
fi

start=$(date +%s)
src=$cache/src-$version
obj=$cache/build
# The source tree records the patches applied to it (.hull-patches: their
# hash; a tree unpacked before patches existed has none, and is pristine).
# Other patches than those recorded: unpack again and build from scratch,
# since kbuild, going by times, would keep objects of the old patches.
applied=$(cat "$src/.hull-patches" 2>/dev/null || true)
if [ -n "$applied" ] && [ "$applied" != "$patched" ]; then
	echo "build-kernel: $src has other patches ($applied); unpacking again" >&2
	rm -rf "$src" "$obj"
fi
if [ ! -f "$src/Makefile" ]; then
	echo "build-kernel: unpacking $tarball" >&2
	rm -rf "$src.tmp" && mkdir -p "$src.tmp"
	tar -xJf "$tarball" -C "$src.tmp" --strip-components=1
	rm -rf "$src" && mv "$src.tmp" "$src"
fi
if [ ! -f "$src/.hull-patches" ]; then
	for p in "${patches[@]}"; do
		echo "build-kernel: applying $(basename "$p")" >&2
		patch -s -p1 -N -d "$src" <"$p" >&2 || { echo "build-kernel: $p does not apply to $srcpkg $version" >&2; rm -rf "$src"; exit 1; }
	done
	echo "$patched" >"$src/.hull-patches"
fi

# One build tree at a fixed path (no key in it), so that the same inputs
# give the same bytes whichever run builds them; kbuild rebuilds only what
# a changed config or a newly patched file touches.
mkdir -p "$obj"
export KBUILD_BUILD_TIMESTAMP="1970-01-01 00:00:00 UTC" KBUILD_BUILD_USER=hull \
	KBUILD_BUILD_HOST=hull KBUILD_BUILD_VERSION=1 LC_ALL=C TZ=UTC
mk() { make -s -C "$src" O="$obj" ARCH=x86_64 "$@"; }
mk tinyconfig >/dev/null
"$src/scripts/kconfig/merge_config.sh" -m -O "$obj" "$obj/.config" "$frag" >/dev/null
mk olddefconfig >/dev/null

# Every line of the fragment must have survived olddefconfig: a symbol
# whose dependencies are missing is silently dropped otherwise.
missing=()
while IFS= read -r line; do
	case "$line" in
	CONFIG_*=*) grep -qxF "$line" "$obj/.config" || missing+=("$line") ;;
	"# CONFIG_"*" is not set")
		sym=${line#\# }; sym=${sym%% *}
		grep -q "^$sym=" "$obj/.config" && missing+=("$line") ;;
	esac
done <"$frag"
if ((${#missing[@]})); then
	printf 'build-kernel: %s did not take effect: %s\n' "$frag" "${missing[*]}" >&2
	exit 1
fi

echo "build-kernel: building $srcpkg $version with $(basename "$frag") ($jobs jobs)" >&2
mk -j"$jobs" vmlinux bzImage >&2
mkdir -p "$dest.tmp"
objcopy --strip-all "$obj/vmlinux" "$dest.tmp/vmlinux"
cp "$obj/vmlinux" "$dest.tmp/vmlinux.debug"
cp "$obj/arch/x86/boot/bzImage" "$dest.tmp/vmlinuz"
cp "$obj/.config" "$dest.tmp/config"
{ echo "$srcpkg=$version"; for p in "${patches[@]}"; do echo "patch $(basename "$p")"; done; } >"$dest.tmp/source"
rm -rf "$dest" && mv "$dest.tmp" "$dest"
echo "build-kernel: built $dest in $(($(date +%s) - start)) s" >&2
echo "$dest"
