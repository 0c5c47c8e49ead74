#!/bin/bash
# Keeps a build cache keyed by its inputs (hack/build-kernel.sh's
# $HULL_CACHE/kernel, hack/build-qemu.sh's $HULL_CACHE/qemu) from growing
# with every change of those inputs:
#
#   hack/prune-cache.sh DIR
#
# DIR is the entry just used (what the build script printed). It is marked
# as used now; of its siblings named by a key (16 hex digits) the two used
# last stay beside it (another checkout, a change being compared), the
# others are removed. An unpacked source tree beside them (src-VERSION, the
# kernel's) stays only while a kept entry was built from it: its `source`
# file has a line PACKAGE=VERSION. Runs under the cache's lock, as the
# builds do, so a build in progress keeps what it uses.
set -euo pipefail

keep_others=2
is_key() { [[ $(basename "$1") =~ ^[0-9a-f]{16}$ ]]; }
dir=$(realpath "${1:?usage: prune-cache.sh DIR}")
cache=$(dirname "$dir")
is_key "$dir" || { echo "prune-cache: $dir is no cache entry (its name is not a 16-digit key)" >&2; exit 2; }
[ -d "$dir" ] || { echo "prune-cache: $dir: no such directory" >&2; exit 2; }

exec 9>"$cache/.lock"
flock 9
touch "$dir"

kept=("$dir")
n=0
# Newest first; names are keys, so they hold no blanks.
for e in $(ls -1dt "$cache"/*/ | sed 's:/$::'); do
	is_key "$e" && [ "$e" != "$dir" ] || continue
	if ((n < keep_others)); then
		kept+=("$e")
		n=$((n + 1))
	else
		echo "prune-cache: removing $e (not among the last $((keep_others + 1)) used)" >&2
		rm -rf "$e"
	fi
done

shopt -s nullglob
for src in "$cache"/src-*/; do
	src=${src%/}
	version=${src##*/src-}
	used=
	for e in "${kept[@]}"; do
		awk -F= -v v="$version" '$2 == v { found = 1 } END { exit !found }' "$e/source" 2>/dev/null && used=1
	done
	if [ -z "$used" ]; then
		echo "prune-cache: removing $src (no kept entry was built from it)" >&2
		rm -rf "$src"
	fi
done
