#!/bin/bash
# `make test`'s builds and suites, each timed, with a summary of every
# suite's time and result and the total at the end. The Makefile sets the
# environment (HULL_E2E=1, HULL_BIN, ...) and installs the packages first.
#
# The builds, most of a fresh machine's run and seconds on a warm one
# (everything cached): make test-prereqs with -j2 (Hull's kernel and QEMU
# side by side, each filling the other's single-threaded stretches), and
# hack/build-compat.sh (the other containerds, critest) in the background
# at idle priority (SCHED_IDLE: only the CPU the rest leaves), through the
# builds and the suites that run on Debian's containerd 1.6 alone; the
# build-compat suite waits for it before the first suite that needs it.
#
# containerd versions (HULL_CONTAINERD, see test/e2e/harness/version.go):
# the CRI and network suites and critest run on each of
# $HULL_TEST_CONTAINERD (default "1.6 1.7 2.2 2.4"); the fault suite on 1.6 and
# 2.4, its churn test (issue 5, ~10 min) on 1.6 only; the hostile and
# security suites once, on 1.6. All on Hull's QEMU (out/qemu/bin, first on
# PATH) but the debian-qemu suite.
# A failing suite does not stop the others; the script fails at the end.
set -uo pipefail
cd "$(dirname "$0")/.."

versions=${HULL_TEST_CONTAINERD:-1.6 1.7 2.2 2.4}
fault_versions=${HULL_TEST_FAULT_CONTAINERD:-1.6 2.4}
churn_version=${HULL_TEST_CHURN_CONTAINERD:-1.6}

names=() secs=() results=()
failed=0
total_start=$SECONDS

# What the tests create on the host (test/hostresidue), listed before and
# after each suite: what a suite added and did not remove fails it.
residue=out/bin/hostresidue
work=$(mktemp -d /tmp/hull-test-residue.XXXXXX)
trap 'rm -rf "$work"' EXIT
go build -o "$residue" ./test/hostresidue || exit 1
"$residue" > "$work/start" || exit 1
if grep -E 'hull-e2e|/k8s.io/' "$work/start" > "$work/old"; then
	echo "warning: this host has what an earlier test run left (a run killed midway?); it does not fail this run:"
	sed 's/^/  /' "$work/old"
fi

# residue_added BEFORE: prints what the host has now that the listing
# BEFORE did not, given up to 10 s to go away (containerd removes a dead
# shim's leftovers in the background); fails when anything is left.
residue_added() {
	local i
	for i in $(seq 10); do
		"$residue" > "$work/after" || return 1
		# hostresidue sorts bytewise; comm must compare the same way.
		LC_ALL=C comm -13 "$1" "$work/after" > "$work/added"
		[ -s "$work/added" ] || return 0
		sleep 1
	done
	cat "$work/added"
	return 1
}

# suite NAME CMD...: runs CMD and records its time and result; a suite
# that leaves anything on the host fails.
suite() {
	local name=$1 start=$SECONDS result=ok left
	shift
	echo "=== suite $name: $*"
	"$residue" > "$work/before" || { echo "hostresidue failed"; result=FAIL; failed=1; }
	"$@" || { result=FAIL; failed=1; }
	if ! left=$(residue_added "$work/before"); then
		echo "=== suite $name left this on the host:"
		echo "$left" | sed 's/^/  /'
		result=FAIL failed=1
	fi
	names+=("$name") secs+=($((SECONDS - start))) results+=("$result")
	echo "=== suite $name: $result in $((SECONDS - start)) s"
}

has() { [[ " $1 " == *" $2 "* ]]; }

summary() {
	echo
	echo "suite                     result  time"
	for i in "${!names[@]}"; do
		printf '%-25s %-7s %4d s\n' "${names[$i]}" "${results[$i]}" "${secs[$i]}"
	done
	printf '%-25s %-7s %4d s\n' total "$( ((failed)) && echo FAIL || echo ok)" $((SECONDS - total_start))
	passed=0
	for r in "${results[@]}"; do [ "$r" = ok ] && passed=$((passed + 1)); done
	echo "suites: $passed passed, $(( ${#results[@]} - passed )) failed"
}

# The background build, in a process group of its own (setsid) so that a
# run that ends early stops all of it; its output is printed when waited for.
setsid chrt --idle 0 bash hack/build-compat.sh >"$work/compat.log" 2>&1 &
compat_pid=$!
echo "=== containerd 1.7, 2.2, 2.4 and critest build in the background (pid $compat_pid)"
stop_compat() {
	[ -n "$compat_pid" ] || return 0
	kill -TERM -- "-$compat_pid" 2>/dev/null
	wait "$compat_pid" 2>/dev/null
	compat_pid=
}
trap 'stop_compat; rm -rf "$work"' EXIT
wait_compat() {
	local rc=0
	wait "$compat_pid" || rc=$?
	compat_pid=
	cat "$work/compat.log"
	return $rc
}
# need_compat: the build-compat suite, once (until it has waited), before
# the first suite on another containerd than Debian's or critest.
need_compat() {
	[ -z "$compat_pid" ] || suite build-compat wait_compat
}

# MAKEFLAGS cleared: a parent make -jN's jobserver is not passed to this script.
suite build env MAKEFLAGS= make -j2 -Oline test-prereqs
if ((failed)); then
	echo "the build failed: no suite runs"
	summary
	exit 1
fi
suite unit-failpoints go test -count=1 -tags hull_failpoints ./internal/failpoint ./internal/shim
suite unit+root go test -count=1 -timeout 20m $(go list ./... | grep -v /test/)
suite harness go test -count=1 ./test/e2e/harness ./test/e2e/net/strictcni ./test/hostresidue
suite hull-run go test -count=1 -timeout 20m ./test/e2e
# The red-team suite (the host holds against a hostile guest) and the
# guest privileges beside runc: once, on Debian's containerd.
suite hostile go test -count=1 -timeout 30m ./test/e2e/hostile
suite security go test -count=1 -timeout 30m ./test/e2e/security
for v in $versions; do
	[ "$v" = 1.6 ] || need_compat
	suite "cri@$v" env HULL_CONTAINERD=$v go test -count=1 -timeout 30m ./test/e2e/cri
	suite "net@$v" env HULL_CONTAINERD=$v go test -count=1 -timeout 30m ./test/e2e/net
	if has "$fault_versions" "$v"; then
		skip=()
		[ "$v" = "$churn_version" ] || skip=(-skip '^TestChurn$')
		suite "faults@$v" env HULL_CONTAINERD=$v go test -count=1 -timeout 40m "${skip[@]}" ./test/e2e/faults
	fi
	# -v: the run prints runc's and Hull's pass counts.
	need_compat
	suite "critest@$v" env HULL_CONTAINERD=$v go test -count=1 -v -timeout 60m ./test/critest
done

# Debian's QEMU, the fallback (docs/qemu.md): hull run's suite and the
# network suite (pods from templates, containerd 1.7) without Hull's QEMU
# on PATH; every other suite runs Hull's (HULL_TEST_QEMU: the one expected).
# without_hull_qemu PATH: PATH without the directories that hold Hull's
# QEMU: out/qemu/bin, and $(PREFIX)/bin where make install put one.
without_hull_qemu() {
	local d keep=() IFS=:
	for d in $1; do
		[ -x "$d/qemu-system-x86_64-hull" ] || keep+=("$d")
	done
	echo "${keep[*]}"
}
need_compat
suite debian-qemu env PATH="$(without_hull_qemu "$PATH")" HULL_TEST_QEMU=qemu-system-x86_64 HULL_CONTAINERD=1.7 \
	go test -count=1 -timeout 20m ./test/e2e ./test/e2e/net

summary
exit $failed
