#!/bin/bash
# `make test`'s suites, each timed, with a summary of every suite's time and
# result and the total at the end. The Makefile sets the environment
# (HULL_E2E=1, HULL_BIN, ...) and builds what the tests need first.
#
# containerd versions (HULL_CONTAINERD, see test/e2e/harness/version.go):
# the CRI and network suites and critest run on each of
# $HULL_TEST_CONTAINERD (default "1.6 1.7 2.2 2.4"); the fault suite on 1.6 and
# 2.4, its churn test (issue 5, ~10 min) on 1.6 only; the hostile and
# security suites once, on 1.6.
# A failing suite does not stop the others; the script fails at the end.
set -uo pipefail
cd "$(dirname "$0")/.."

versions=${HULL_TEST_CONTAINERD:-1.6 1.7 2.2 2.4}
fault_versions=${HULL_TEST_FAULT_CONTAINERD:-1.6 2.4}
churn_version=${HULL_TEST_CHURN_CONTAINERD:-1.6}

names=() secs=() results=()
failed=0
total_start=$SECONDS

# suite NAME CMD...: runs CMD and records its time and result.
suite() {
	local name=$1 start=$SECONDS result=ok
	shift
	echo "=== suite $name: $*"
	"$@" || { result=FAIL; failed=1; }
	names+=("$name") secs+=($((SECONDS - start))) results+=("$result")
	echo "=== suite $name: $result in $((SECONDS - start)) s"
}

has() { [[ " $1 " == *" $2 "* ]]; }

suite build-compat bash hack/build-compat.sh
suite unit-failpoints go test -count=1 -tags hull_failpoints ./internal/failpoint ./internal/shim
suite unit+root go test -count=1 -timeout 20m $(go list ./... | grep -v /test/)
suite harness go test -count=1 ./test/e2e/harness ./test/e2e/net/strictcni
suite hull-run go test -count=1 -timeout 20m ./test/e2e
# The red-team suite (the host holds against a hostile guest) and the
# guest privileges beside runc: once, on Debian's containerd.
suite hostile go test -count=1 -timeout 30m ./test/e2e/hostile
suite security go test -count=1 -timeout 30m ./test/e2e/security
for v in $versions; do
	suite "cri@$v" env HULL_CONTAINERD=$v go test -count=1 -timeout 30m ./test/e2e/cri
	suite "net@$v" env HULL_CONTAINERD=$v go test -count=1 -timeout 30m ./test/e2e/net
	if has "$fault_versions" "$v"; then
		skip=()
		[ "$v" = "$churn_version" ] || skip=(-skip '^TestChurn$')
		suite "faults@$v" env HULL_CONTAINERD=$v go test -count=1 -timeout 40m "${skip[@]}" ./test/e2e/faults
	fi
	# -v: the run prints runc's and Hull's pass counts.
	suite "critest@$v" env HULL_CONTAINERD=$v go test -count=1 -v -timeout 60m ./test/critest
done

echo
echo "suite                     result  time"
for i in "${!names[@]}"; do
	printf '%-25s %-7s %4d s\n' "${names[$i]}" "${results[$i]}" "${secs[$i]}"
done
printf '%-25s %-7s %4d s\n' total "$( ((failed)) && echo FAIL || echo ok)" $((SECONDS - total_start))
passed=0
for r in "${results[@]}"; do [ "$r" = ok ] && passed=$((passed + 1)); done
echo "suites: $passed passed, $(( ${#results[@]} - passed )) failed"
exit $failed
