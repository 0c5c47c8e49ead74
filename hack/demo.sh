#!/bin/bash
# The demo: run commands in a throwaway VM with the installed hull, then
# show that nothing is left behind.
set -euo pipefail
rootfs=${1:?usage: demo.sh ROOTFS}
hull=${HULL:-/usr/local/bin/hull}

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "host kernel: $(uname -r)"
say "hull run --rootfs $rootfs -- sh -c '...'   (boots a VM, runs the command inside, tears it all down)"
set +e
time "$hull" run --rootfs "$rootfs" --memory 256 -- sh -c '
	echo "hello from $(hostname), a VM running kernel $(uname -r)"
	echo "guest memory: $(awk "/MemTotal/ {print \$2 \" kB\"}" /proc/meminfo)"
	echo "this goes to stderr" >&2
	exit 7'
code=$?
set -e
say "exit code of the command, passed through: $code"

say "stdin is wired too: echo 'piped through the VM' | hull run -i -- tr a-z A-Z"
echo 'piped through the VM' | "$hull" run --rootfs "$rootfs" -i -- tr a-z A-Z

say "nothing left behind"
echo "QEMU processes: $(pgrep -c -f qemu-system || true)"
echo "VM directories under /run/hull: $(ls /run/hull 2>/dev/null | wc -l)"
