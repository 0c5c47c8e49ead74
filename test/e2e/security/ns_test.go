package security

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

// probe prints "NAME ok" or "NAME denied" for each shell command.
const probeFn = `probe() { if sh -c "$2" >/dev/null 2>&1; then echo "$1 ok"; else echo "$1 denied"; fi; }
`

// deviceProbes: mknod of a block device, opening a character device that
// is not on the default allow list (/dev/kmsg, there in both the host and
// the guest), opening a guest disk (vda) and mounting. Nodes are made in
// /dev, a tmpfs under both runtimes (Hull's rootfs is a 9p share).
const deviceProbes = probeFn + `probe mknod-b 'mknod /dev/probe-b b 7 0'
probe open-kmsg 'mknod /dev/probe-k c 1 11; exec 3</dev/probe-k'
probe open-vda 'mknod /dev/probe-vda b 254 0; exec 3</dev/probe-vda'
probe mount 'mkdir -p /tmp/probe-m && mount -t tmpfs x /tmp/probe-m'
`

// psProbe lists the command lines of the processes the container sees;
// kernel threads have none and show as [comm] (a process gone meanwhile
// as []).
const psProbe = `for p in /proc/[0-9]*; do c="$(tr '\0' ' ' < $p/cmdline 2>/dev/null)"; [ -n "$c" ] || c="[$(cat $p/comm 2>/dev/null)]"; [ "$c" = "[]" ] || echo "$c"; done | sort -u`

// nsProbes runs every probe in a pod of handler in CRI's POD PID mode and
// returns the results by name.
func nsProbes(t *testing.T, e *env, handler string) map[string]string {
	res := map[string]string{}
	pod := e.runPod("sec-"+handler, handler, podOptions{pid: runtime.NamespaceMode_POD, privileged: true})
	def := e.start(pod, container{name: "def"})
	priv := e.start(pod, container{name: "priv", privileged: true})
	e.start(pod, container{name: "tty1", tty: true})
	tty2 := e.start(pod, container{name: "tty2", tty: true})
	ro := e.start(pod, container{name: "ro", readonly: true})

	for _, c := range []struct{ name, id string }{{"default", def}, {"privileged", priv}} {
		for _, l := range strings.Split(strings.TrimSpace(e.sh(c.id, deviceProbes)), "\n") {
			if f := strings.Fields(l); len(f) == 2 {
				res[c.name+"."+f[0]] = f[1]
			}
		}
	}
	res["ps"] = e.sh(def, psProbe)
	res["pause"] = strings.Join(strings.Fields(e.sh(def, "grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/1/status; ls /proc/1/root/")), " ")
	res["tty2 /dev/pts"] = strings.Join(strings.Fields(e.sh(tty2, "ls /dev/pts")), " ")
	res["tty2 opens its ptmx"] = strings.TrimSpace(e.sh(tty2, probeFn+"probe ptmx 'exec 3<>/dev/ptmx'"))
	res["readonly rootfs write"] = strings.TrimSpace(e.sh(ro, probeFn+"probe write 'touch /x'"))

	// A container whose init exits leaving a process in the pod's pid
	// namespace: the process is killed when init exits, as containerd's
	// runc shim does, and the container is removed.
	leaver := e.start(pod, container{name: "leaver", cmd: []string{"sh", "-c", "sleep 1047 </dev/null >/dev/null 2>&1 & exit 0"}, exits: true})
	res["leaver's sleep once it exited"] = e.psHas(def, "sleep 1047")
	_, err := e.cri.RemoveContainer(e.ctx(2*time.Minute), &runtime.RemoveContainerRequest{ContainerId: leaver})
	res["leaver removed"] = fmt.Sprint(err)
	res["leaver's sleep after its removal"] = e.psHas(def, "sleep 1047")

	// kill -TERM 1 hits the pause, which ignores it (runc: the image's
	// sleep, without a handler; Hull's pause: a signal from inside the
	// pod, docs/sandbox.md).
	e.sh(def, "kill -TERM 1")
	res["after kill -TERM 1"] = e.podAlive(pod, def)
	// kill -9 -1 kills every process of the pod but the pause and the
	// caller: the containers' inits exit, the pod stays.
	e.sh(def, "kill -9 -1")
	time.Sleep(2 * time.Second)
	after := e.start(pod, container{name: "after"})
	res["after kill -9 -1"] = e.podAlive(pod, after)
	return res
}

// psHas says whether a process of the container's pid namespace has
// the command line cmd.
func (e *env) psHas(id, cmd string) string {
	for _, l := range strings.Split(e.sh(id, psProbe), "\n") {
		if strings.TrimSpace(l) == cmd {
			return "running"
		}
	}
	return "gone"
}

// podAlive says whether the pod is ready and a container of it answers
// an exec.
func (e *env) podAlive(pod *harness.Pod, id string) string {
	ctx := e.ctx(2 * time.Minute)
	st, err := e.cri.PodState(ctx, pod)
	if err != nil || st != runtime.PodSandboxState_SANDBOX_READY {
		return fmt.Sprintf("pod %v %v", st, err)
	}
	_, _, code, err := e.cri.Exec(ctx, id, time.Minute, "true")
	if err != nil || code != 0 {
		return fmt.Sprintf("exec: %d %v", code, err)
	}
	return "pod ready, exec ok"
}

// TestNamespacesDevicesMountsAsRunc runs the probes under runc and Hull
// and compares them; Hull's must also be what the pod's walls require.
func TestNamespacesDevicesMountsAsRunc(t *testing.T) {
	e := newEnv(t)
	runc := nsProbes(t, e, "runc")
	hull := nsProbes(t, e, harness.HandlerHull)
	// The sandbox's process is the one difference: the pause image's
	// command under runc, Hull's pause (its uid and gids follow) under
	// Hull (docs/sandbox.md).
	hullPS := hull["ps"]
	runc["ps"] = namePause(runc["ps"], func(l string) bool { return l == "/bin/sleep 2147483647 " })
	hull["ps"] = namePause(hull["ps"], func(l string) bool { return strings.HasPrefix(l, "/pause ") })
	var keys []string
	for k := range runc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("%s: runc %q, hull %q", k, runc[k], hull[k])
		if k != "pause" && runc[k] != hull[k] {
			t.Errorf("%s differs: runc %q, hull %q", k, runc[k], hull[k])
		}
	}
	want := map[string]string{
		"default.mknod-b":                  "ok",
		"default.open-kmsg":                "denied",
		"default.open-vda":                 "denied",
		"default.mount":                    "denied",
		"privileged.open-kmsg":             "ok",
		"privileged.mount":                 "ok",
		"tty2 /dev/pts":                    "0 ptmx",
		"tty2 opens its ptmx":              "ptmx ok",
		"readonly rootfs write":            "write denied",
		"after kill -TERM 1":               "pod ready, exec ok",
		"after kill -9 -1":                 "pod ready, exec ok",
		"leaver's sleep once it exited":    "gone",
		"leaver removed":                   "<nil>",
		"leaver's sleep after its removal": "gone",
		// Hull's pause: no capability, no_new_privs, nothing in its root
		// but itself (runc's is the image's sleep, as root).
		"pause": "CapEff: 0000000000000000 CapBnd: 0000000000000000 NoNewPrivs: 1 pause",
	}
	for k, v := range want {
		if hull[k] != v {
			t.Errorf("hull %s = %q, want %q", k, hull[k], v)
		}
	}
	ps := strings.Split(hull["ps"], "\n")
	if !contains(ps, "<pause>") {
		t.Errorf("hull: Hull's pause is not in the pod's pid namespace:\n%s", hullPS)
	}
	for _, l := range ps {
		if strings.HasPrefix(l, "[") || strings.Contains(l, "hull") {
			t.Errorf("hull: the pod's pid namespace shows %q (the agent or a kernel thread):\n%s", l, hullPS)
		}
	}
}

// namePause replaces the one line of a ps probe that is the sandbox's
// process with "<pause>", in sorted order again.
func namePause(ps string, isPause func(string) bool) string {
	lines := strings.Split(ps, "\n")
	n := 0
	for i, l := range lines {
		if isPause(l) {
			lines[i] = "<pause>"
			n++
		}
	}
	if n != 1 {
		return ps // left as it is, the comparison shows it
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
