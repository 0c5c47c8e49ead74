package security

import (
	"strings"
	"testing"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// catchHelper is runc's CVE-2019-5736 from inside a pod: a privileged
// container's init waits for the next process of its pid namespace (the
// pid after a child it forks and reaps; the shell forks nothing while it
// waits): what an exec into the container starts there, the agent's fork,
// then the helper. It stops that process as soon as it exists (one
// kill a try: a stat first lost the race to the helper's exec on a fast
// host), opens its /proc/PID/exe, lets
// it go on, and once it has executed the exec's command, opens the file
// again and writes to it. Whoever can write it replaces the binary of the
// agent and of every later helper. One line per catch in /tmp/results:
// "exe|outcome".
const catchHelper = `while :; do
	: & n=$(($! + 1)); wait
	until kill -STOP $n 2>/dev/null; do :; done
	exe=$(readlink /proc/$n/exe)
	[ -n "$exe" ] || { kill -CONT $n; continue; }
	exec 3< /proc/$n/exe
	kill -CONT $n
	while [ "$(readlink /proc/$n/exe 2>/dev/null)" = "$exe" ]; do :; done
	if ( printf x >> /proc/self/fd/3 ) 2>/tmp/err; then r=written; else r="refused: $(cat /tmp/err)"; fi
	exec 3<&-
	echo "$exe|$r" >> /tmp/results
done`

// TestHelperBinaryCannotBeWritten: the attack above, through ExecSync,
// finds the agent's binary on a read-only filesystem (docs/security.md),
// not merely busy while the agent runs it.
func TestHelperBinaryCannotBeWritten(t *testing.T) {
	e := newEnv(t)
	pod := e.runPod("catch-hull", "hull", podOptions{pid: runtime.NamespaceMode_CONTAINER, privileged: true})
	id := e.start(pod, container{name: "catcher", privileged: true, cmd: []string{"sh", "-c", catchHelper}})
	var caught []string
	var out string
	for i := 0; i < 30 && len(caught) < 3; i++ {
		// Each exec is also a helper for the container to catch.
		out = e.sh(id, "cat /tmp/results 2>/dev/null; true")
		caught = caught[:0]
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if exe, _, ok := strings.Cut(l, "|"); ok && !strings.Contains(exe, "busybox") {
				caught = append(caught, l)
			}
		}
	}
	if len(caught) == 0 {
		t.Fatalf("the container caught no helper in 30 execs: the attack did not run (its results: %q; its processes:\n%s)", out, e.sh(id, "ps -o pid,stat,args"))
	}
	for _, c := range caught {
		exe, outcome, _ := strings.Cut(c, "|")
		if !strings.Contains(outcome, "Read-only file system") {
			t.Errorf("a process of the container reached %s: %s", exe, outcome)
		} else {
			t.Logf("caught %s: %s", exe, outcome)
		}
	}
}
