#!/bin/bash
# Builds Hull's QEMU (docs/qemu.md): Debian's qemu source package of the
# installed qemu-system-x86's version, with only the devices in
# guest/qemu/hull-devices.mak, into a cache outside the clone keyed by a
# hash of its inputs; prints the path of the binary. A second run with the
# same inputs builds nothing. Firmware and option ROMs stay Debian's.
#
#   hack/build-qemu.sh     (root on a fresh machine: installs build deps)
#
# Environment: HULL_CACHE (default /var/cache/hull), HULL_QEMU_JOBS
# (default nproc).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
devices=$(realpath "$here/../guest/qemu/hull-devices.mak")
cache=${HULL_CACHE:-/var/cache/hull}/qemu
jobs=${HULL_QEMU_JOBS:-$(nproc)}

have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
have_pkg qemu-system-x86 || bash "$here/install-deps.sh" >&2
version=$(dpkg-query -W -f='${Version}' qemu-system-x86)
# The source package's version: the binary's without a binNMU suffix
# (+bN), which rebuilds the same source.
srcversion=${version%+b[0-9]*}

# The key: the device list, this script (the recipe and its flags) and the
# source version.
key=$( { cat "$devices"; cat "$0"; echo "qemu=$srcversion"; } | sha256sum | cut -c1-16)
dest=$cache/$key
if [ -x "$dest/qemu-system-x86_64-hull" ]; then
	echo "build-qemu: cached $dest (qemu $srcversion)" >&2
	echo "$dest/qemu-system-x86_64-hull"
	exit 0
fi
bash "$here/install-deps.sh" qemu >&2

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9 # one build at a time
if [ -x "$dest/qemu-system-x86_64-hull" ]; then
	echo "$dest/qemu-system-x86_64-hull"
	exit 0
fi

start=$(date +%s)
work=$cache/work
rm -rf "$work" && mkdir -p "$work/apt/lists/partial" "$work/apt/sources.list.d"
trap 'rm -rf "$work"' EXIT

# The host's own Debian archives as deb-src, in a private apt list: the
# host's apt configuration and package lists are not touched.
for f in /etc/apt/sources.list.d/*.sources; do
	[ -f "$f" ] && sed 's/^Types:.*/Types: deb-src/' "$f" >"$work/apt/sources.list.d/$(basename "$f")"
done
touch "$work/apt/sources.list"
[ -f /etc/apt/sources.list ] && sed -n 's/^deb[[:space:]]/deb-src /p' /etc/apt/sources.list >"$work/apt/sources.list"
apt=(apt-get -q -o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=$work/apt/sources.list.d"
	-o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache::Archives=$work/apt" -o APT::Sandbox::User=root)
echo "build-qemu: fetching the source of qemu $srcversion" >&2
"${apt[@]}" update >/dev/null 2>&1 || "${apt[@]}" update >&2
(cd "$work" && "${apt[@]}" source --download-only "qemu=$srcversion" >/dev/null) ||
	{ echo "build-qemu: apt-get source qemu=$srcversion failed (no deb-src for it in this host's archives?)" >&2; exit 1; }
dsc=$(ls "$work"/qemu_*.dsc)
# apt checked the files against the archive's signed index; the .dsc's own
# signature would need Debian's keyring of uploaders.
dpkg-source --no-check -x "$dsc" "$work/src" >/dev/null

src=$work/src
cp "$devices" "$src/configs/devices/x86_64-softmmu/hull.mak"
cflags="$(DEB_BUILD_MAINT_OPTIONS=hardening=+all dpkg-buildflags --get CFLAGS | sed 's/-g //;s/ -g$//') $(DEB_BUILD_MAINT_OPTIONS=hardening=+all dpkg-buildflags --get CPPFLAGS)"
ldflags=$(DEB_BUILD_MAINT_OPTIONS=hardening=+all dpkg-buildflags --get LDFLAGS)
echo "build-qemu: building qemu-system-x86_64 $srcversion with $(basename "$devices") ($jobs jobs)" >&2
mkdir -p "$src/build"
# Debian's python3 and meson (a python3 of the user's own may come first
# on PATH). The prefix is no directory's: QEMU finds its files relative
# to where its binary is when they are under the prefix, and Debian's
# firmware directories (--firmwarepath) must stay as they are, wherever
# the binary is installed.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
(cd "$src/build" && ../configure --meson=/usr/bin/meson \
	--prefix=/usr/lib/hull-qemu --target-list=x86_64-softmmu \
	--without-default-features --without-default-devices --with-devices-x86_64=hull \
	--enable-tcg --enable-kvm --enable-seccomp --enable-virtfs --enable-attr --enable-cap-ng --enable-fdt=system \
	--enable-pie --enable-malloc-trim --disable-werror --disable-docs --disable-tools --disable-guest-agent --disable-install-blobs \
	--firmwarepath=/usr/share/qemu:/usr/share/seabios:/usr/lib/ipxe/qemu \
	--with-pkgversion="Hull $srcversion" \
	--extra-cflags="$cflags" --extra-ldflags="$ldflags" >"$work/configure.log" 2>&1) ||
	{ tail -30 "$work/configure.log" >&2; echo "build-qemu: configure failed" >&2; exit 1; }
nice -n 10 ninja -C "$src/build" -j"$jobs" qemu-system-x86_64 >"$work/build.log" 2>&1 ||
	{ tail -30 "$work/build.log" >&2; echo "build-qemu: build failed" >&2; exit 1; }

mkdir -p "$dest.tmp"
strip -o "$dest.tmp/qemu-system-x86_64-hull" "$src/build/qemu-system-x86_64"
{ echo "qemu=$srcversion"; echo "devices:"; grep '^CONFIG_' "$devices"; } >"$dest.tmp/source"
rm -rf "$dest" && mv "$dest.tmp" "$dest"
echo "build-qemu: built $dest in $(($(date +%s) - start)) s" >&2
echo "$dest/qemu-system-x86_64-hull"
