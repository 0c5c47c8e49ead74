#!/bin/bash
# Builds a busybox root filesystem in DIR from Debian's busybox-static.
set -euo pipefail
dir=${1:?usage: busybox-rootfs.sh DIR}
bb=/bin/busybox
[ -x "$bb" ] || { echo "missing $bb: apt-get install busybox-static" >&2; exit 1; }
rm -rf "$dir.tmp"
mkdir -p "$dir.tmp"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,root,var,run}
chmod 1777 "$dir.tmp/tmp"
cp "$bb" "$dir.tmp/bin/busybox"
for applet in $("$bb" --list-full); do
	[ -e "$dir.tmp/$applet" ] || ln -s /bin/busybox "$dir.tmp/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$dir.tmp/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$dir.tmp/etc/group"
echo hull >"$dir.tmp/etc/hostname"
rm -rf "$dir"
mv "$dir.tmp" "$dir"
