package cri

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/cli"
	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

// Handlers of the template test: the same configuration with templates
// on and off, over a copy of the test kernel (which the test changes).
const (
	handlerTemplate = "hull-template"
	handlerCold     = "hull-cold"
)

type templateEnv struct {
	*env
	kernel string
}

func newTemplateEnv(t *testing.T) *templateEnv {
	t.Helper()
	e, dir := newEnvDir(t, "hull-tpl-")
	k := filepath.Join(dir, "vmlinux")
	b, err := os.ReadFile(kernel)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, k, string(b))
	cfg := func(on bool) string {
		p := filepath.Join(dir, "template-"+strconv.FormatBool(on)+".toml")
		writeFile(t, p, fmtConfig(k, on))
		return p
	}
	opts := harness.Options{Dir: filepath.Join(dir, "ctd"), ShimDir: shimDir,
		HullHandlers: map[string]string{handlerTemplate: cfg(true), handlerCold: cfg(false)}}
	e.ctd, e.cri = harness.LaunchT(t, opts, 60, nil)
	return &templateEnv{env: e, kernel: k}
}

func fmtConfig(kernel string, template bool) string {
	return "[hypervisor.qemu]\nkernel = " + strconv.Quote(kernel) + "\ninitrd = " + strconv.Quote(initrd) +
		"\n\n[agent]\ndial_timeout = 120\n\n[factory]\nenable_template = " + strconv.FormatBool(template) + "\n"
}

// hull runs the hull CLI on the test containerd's state root.
func (e *templateEnv) hull(args ...string) string {
	e.t.Helper()
	args = append(args, "--root", e.ctd.StateDir)
	out, err := exec.Command(os.Getenv("HULL_BIN"), args...).CombinedOutput()
	if err != nil {
		e.t.Fatalf("hull %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (e *templateEnv) templates() []cli.TemplateEntry {
	e.t.Helper()
	var list []cli.TemplateEntry
	if err := json.Unmarshal([]byte(e.hull("template", "ls", "--json")), &list); err != nil {
		e.t.Fatal(err)
	}
	return list
}

// qemuOf is the QEMU of pod, from `hull ps`.
func (e *templateEnv) qemuOf(pod *harness.Pod) int {
	e.t.Helper()
	var ps []cli.PsEntry
	if err := json.Unmarshal([]byte(e.hull("ps", "--json")), &ps); err != nil {
		e.t.Fatal(err)
	}
	for _, p := range ps {
		if p.ID == pod.ID && p.QEMUAlive {
			return p.QEMUPid
		}
	}
	e.t.Fatalf("pod %s has no QEMU running in hull ps", pod.ID)
	return 0
}

// restored says whether pod's QEMU was restored from a template.
func (e *templateEnv) restored(pod *harness.Pod) bool {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(e.qemuOf(pod)) + "/cmdline")
	return bytes.Contains(b, []byte("\x00-incoming\x00"))
}

// identity is what must differ between two clones.
type identity struct{ bootID, uuid, random string }

func (e *templateEnv) identityOf(ctx context.Context, pod *harness.Pod, name string) (identity, string) {
	id := startRunning(e.t, ctx, e.cri, pod, harness.Container{Name: name, Command: sleeper()})
	sh := func(script string) string { return execOK(e.t, ctx, e.cri, id, "sh", "-c", script) }
	guestNow, err := strconv.ParseInt(sh("date +%s"), 10, 64)
	if err != nil {
		e.t.Fatal(err)
	}
	if d := time.Since(time.Unix(guestNow, 0)); d > 5*time.Second || d < -5*time.Second {
		e.t.Errorf("pod %s: the guest's clock is %v off the host's", name, d)
	}
	return identity{
		bootID: sh("cat /proc/sys/kernel/random/boot_id"),
		uuid:   sh("cat /proc/sys/kernel/random/uuid"),
		random: sh("head -c 16 /dev/urandom | od -An -tx1"),
	}, id
}

// TestHullTemplate: with [factory] enable_template, pods are restored
// from one template built by the first; each clone has its own boot id,
// random state and clock; a template removed under running clones leaves
// them working; a corrupt template is rebuilt, and a clone that fails
// boots cold, with a warning, never a failed pod; a changed kernel makes
// a new template and `hull gc` removes the stale one. With templates off
// the pod boots.
func TestHullTemplate(t *testing.T) {
	requireHull(t)
	e := newTemplateEnv(t)
	ctx := e.ctx(10 * time.Minute)

	a := e.runPod("tpl-a", handlerTemplate)
	b := e.runPod("tpl-b", handlerTemplate)
	if !e.restored(a) || !e.restored(b) {
		t.Fatalf("pods with templates on were booted, not restored (a %v, b %v)", e.restored(a), e.restored(b))
	}
	idA, ctrA := e.identityOf(ctx, a, "a")
	idB, _ := e.identityOf(ctx, b, "b")
	t.Logf("clone a: %+v; clone b: %+v", idA, idB)
	if idA.bootID == idB.bootID || idA.uuid == idB.uuid || idA.random == idB.random {
		t.Errorf("two clones share identity or random state: %+v and %+v", idA, idB)
	}
	list := e.templates()
	if len(list) != 1 || list[0].Stale || list[0].Error != "" {
		t.Fatalf("templates after two pods: %+v, want one ready", list)
	}
	e.checkHandsBackFreedMemory(ctx, a, ctrA, filepath.Join(e.ctd.StateDir, ".templates", list[0].Key, "memory"))

	// Removed under running clones: they keep working on the unlinked file.
	e.hull("template", "rm", "--all")
	if maps, _ := os.ReadFile("/proc/" + strconv.Itoa(e.qemuOf(a)) + "/maps"); !bytes.Contains(maps, []byte("/memory (deleted)")) {
		t.Errorf("pod a's QEMU does not map the removed template's memory:\n%s", maps)
	}
	if out := execOK(t, ctx, e.cri, ctrA, "echo", "still here"); out != "still here" {
		t.Errorf("clone after its template was removed: %q", out)
	}
	if err := e.cri.RemovePod(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.cri.RemovePod(ctx, b.ID); err != nil {
		t.Fatal(err)
	}

	// A corrupt state file: the template is rebuilt, the pod restored.
	c := e.runPod("tpl-c", handlerTemplate)
	list = e.templates()
	if len(list) != 1 {
		t.Fatalf("templates: %+v", list)
	}
	if err := e.cri.RemovePod(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	tdir := filepath.Join(e.ctd.StateDir, ".templates", list[0].Key)
	writeFile(t, filepath.Join(tdir, "state"), "QEVM garbage")
	d := e.runPod("tpl-d", handlerTemplate)
	if !e.restored(d) {
		t.Errorf("pod after a corrupt state file was not restored from a rebuilt template")
	}
	if !strings.Contains(e.ctd.Log(2000), "VM template unusable; rebuilding it") {
		t.Errorf("no warning about the corrupt template in containerd's log")
	}
	if err := e.cri.RemovePod(ctx, d.ID); err != nil {
		t.Fatal(err)
	}

	// Damaged memory: the clone does not answer; the pod boots cold.
	mem, err := os.OpenFile(filepath.Join(tdir, "memory"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 64<<20)
	rand.Read(junk)
	mem.WriteAt(junk, 0)
	mem.Close()
	f := e.runPod("tpl-f", handlerTemplate)
	if e.restored(f) {
		t.Errorf("a pod runs from a template whose memory is garbage")
	}
	if !strings.Contains(e.ctd.Log(2000), "booting it") {
		t.Errorf("no warning about the failed clone in containerd's log")
	}
	idF, _ := e.identityOf(ctx, f, "f")
	if idF.bootID == "" {
		t.Errorf("cold-booted pod: no boot id")
	}
	if err := e.cri.RemovePod(ctx, f.ID); err != nil {
		t.Fatal(err)
	}

	// A changed kernel: a new template; the old one is stale, and gc
	// removes it.
	g := e.runPod("tpl-g", handlerTemplate) // rebuilds the dropped template
	if !e.restored(g) {
		t.Errorf("pod after the failed clone: not restored from a rebuilt template")
	}
	if err := e.cri.RemovePod(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	old := e.templates()
	k, err := os.OpenFile(e.kernel, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	k.Write([]byte("changed"))
	k.Close()
	h := e.runPod("tpl-h", handlerTemplate)
	if !e.restored(h) {
		t.Errorf("pod with a changed kernel: not restored")
	}
	now := e.templates()
	if len(old) != 1 || len(now) != 2 {
		t.Fatalf("templates before the kernel changed %+v, after %+v; want 1 then 2", old, now)
	}
	out := e.hull("gc")
	if !strings.Contains(out, "removed stale VM template "+old[0].Key) {
		t.Errorf("hull gc did not remove the stale template %s:\n%s", old[0].Key, out)
	}
	if now = e.templates(); len(now) != 1 || now[0].Key == old[0].Key {
		t.Errorf("after gc: %+v", now)
	}

	cold := e.runPod("tpl-cold", handlerCold)
	if e.restored(cold) {
		t.Errorf("a pod with templates off was restored")
	}
}

// rssAnon is a process's anonymous resident memory (a clone's pages of
// its own: those its guest wrote), in MiB.
func rssAnon(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "RssAnon:" {
			kb, _ := strconv.Atoi(f[1])
			return kb >> 10
		}
	}
	t.Fatalf("no RssAnon in /proc/%d/status", pid)
	return 0
}

// checkHandsBackFreedMemory: memory a clone's guest frees goes back to
// the host (free page reporting), as a booted VM's does, and the template
// every clone maps is not touched by it. A process in the container fills
// 96 MiB and exits; the clone's QEMU holds that much more of its own,
// then, once the guest has reported the free pages, no longer.
func (e *templateEnv) checkHandsBackFreedMemory(ctx context.Context, pod *harness.Pod, ctr, templateMemory string) {
	t := e.t
	t.Helper()
	sum := leakcheck.TreeDigest(templateMemory)
	qemu := e.qemuOf(pod)
	base := rssAnon(t, qemu)
	// dd's one 96 MiB block: its buffer is written whole, then freed at exit
	execOK(t, ctx, e.cri, ctr, "dd", "if=/dev/zero", "of=/dev/null", "bs=96M", "count=1")
	peak := rssAnon(t, qemu)
	if peak-base < 64 {
		t.Fatalf("the clone's QEMU holds %d MiB of its own after the guest wrote 96 MiB, %d before: the test wrote too little", peak, base)
	}
	freed := time.Now()
	now := peak
	for ; now > base+32 && time.Since(freed) < 30*time.Second; now = rssAnon(t, qemu) {
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("clone's QEMU anonymous memory: %d MiB, %d MiB after 96 MiB written in the guest, %d MiB %v after it was freed",
		base, peak, now, time.Since(freed).Round(100*time.Millisecond))
	if now > base+32 {
		t.Errorf("the clone's QEMU still holds %d MiB of its own 30 s after its guest freed 96 MiB (%d MiB before, %d MiB at the peak)", now, base, peak)
	}
	if got := leakcheck.TreeDigest(templateMemory); got != sum {
		t.Errorf("the template's memory changed while a clone handed memory back: digest %s, was %s", got, sum)
	}
}
