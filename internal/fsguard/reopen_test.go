package fsguard

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/testenv"
)

// cloneAttack is what the child, standing for a clone's QEMU that the
// guest took over, does to its template's memory file (Template) after
// opening it as QEMU 7.2 does, O_RDWR; Other is a file of its share,
// which it opens the same way and may write.
type cloneAttack struct {
	Template, Other string
}

const cloneAttackEnv = "HULL_FSGUARD_CLONE_ATTACK"

// run prints one "name outcome" line per attempt.
func (a cloneAttack) run() {
	report := func(name string, err error) { fmt.Println(name, testenv.Outcome(err)) }
	fd, err := unix.Open(a.Template, unix.O_RDWR|unix.O_CLOEXEC, 0)
	report("open-rdwr", err)
	if err == nil {
		fl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		fdfl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		fmt.Println("accmode", fl&unix.O_ACCMODE)
		fmt.Println("cloexec", fdfl&unix.FD_CLOEXEC)
		link, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
		fmt.Println("fd-path-as-opened", link == a.Template)
		// what QEMU does with it: a private, writable mapping, whose
		// pages the guest freed it discards, punching a hole in the file
		// and then dropping its copy
		m, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
		report("mmap-private", err)
		if err == nil {
			copy(m, "guest")
			report("discard-punch", unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096))
			report("discard-madvise", unix.Madvise(m, unix.MADV_DONTNEED))
			fmt.Println("discarded-reads", strings.TrimRight(string(m[:8]), "\x00"))
			unix.Munmap(m)
		}
		// what it must not
		_, err = unix.Pwrite(fd, []byte("guest"), 0)
		report("pwrite", err)
		report("ftruncate", unix.Ftruncate(fd, 0))
		report("fchmod", unix.Fchmod(fd, 0o666))
		report("fchown", unix.Fchown(fd, 65534, 65534))
		rfd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(fd), unix.O_RDWR, 0)
		report("reopen-rdwr", err)
		if err == nil {
			unix.Pwrite(rfd, []byte("reopened"), 0)
		}
	}
	// by path, not through the answered open
	_, err = unix.Open(a.Template, unix.O_WRONLY, 0)
	report("open-wronly", err)
	if dfd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY, 0); err == nil {
		_, err = unix.Openat(dfd, strings.TrimPrefix(a.Template, "/"), unix.O_RDWR, 0)
		report("openat-dirfd", err)
	}
	report("chmod", unix.Chmod(a.Template, 0o666))
	report("chown", unix.Chown(a.Template, 65534, 65534))
	report("truncate", unix.Truncate(a.Template, 0))
	// every other open for writing goes on as made
	ofd, err := unix.Open(a.Other, unix.O_RDWR|unix.O_CREAT, 0o644)
	report("open-other", err)
	if err == nil {
		_, err = unix.Write(ofd, bytes.Repeat([]byte("x"), 8192))
		report("write-other", err)
		// and a punch into it is made
		report("punch-other", unix.Fallocate(ofd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096))
		b := make([]byte, 1)
		unix.Pread(ofd, b, 0)
		fmt.Println("punched-other-reads", b[0])
	}
}

// A clone's QEMU opens its template's memory file for writing; the
// confined child standing for a fallen one, opening it the same way,
// writes and re-modes the file every clone maps (the control, with
// the policy clones had). With the file bound read-only and its open
// answered read-only (Policy.ReadOnlyOpens), the child still maps it
// privately and writes its copy, and the file stays as it was; other
// opens for writing go on; the answering leaves no descriptor behind.
func TestFallenCloneTemplate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root test: run `go test ./internal/fsguard` as root")
	}
	content := bytes.Repeat([]byte("template"), 8192)
	readOnly := map[string]string{
		"open-rdwr": "ok", "accmode": "0", "cloexec": "1", "fd-path-as-opened": "true", "mmap-private": "ok",
		// the punch succeeds without effect; the private copy is dropped
		"discard-punch": "ok", "discard-madvise": "ok", "discarded-reads": "template",
		"pwrite": "bad file descriptor", "ftruncate": "invalid argument",
		"fchmod": "read-only file system", "fchown": "read-only file system", "reopen-rdwr": "read-only file system",
		"open-wronly": "read-only file system", "openat-dirfd": "read-only file system",
		"chmod": "read-only file system", "chown": "read-only file system", "truncate": "operation not permitted",
		"open-other": "ok", "write-other": "ok", "punch-other": "ok", "punched-other-reads": "0",
	}
	for _, c := range []struct {
		name     string
		readOnly bool
		abi      int // the kernel's, as Confine sees it; -1: this one's
		// beforeSend: answered as before Linux 5.14 (completeCall)
		beforeSend bool
		want       map[string]string
	}{
		{"control", false, -1, false, map[string]string{
			"open-rdwr": "ok", "accmode": "2", "pwrite": "ok", "discard-punch": "ok", "discarded-reads": "", "fchmod": "ok", "chmod": "ok",
			"open-other": "ok", "write-other": "ok", "punch-other": "ok", "punched-other-reads": "0",
		}},
		{"read-only", true, -1, false, readOnly},
		{"read-only-before-5.14", true, -1, true, readOnly},
		{"read-only-no-landlock", true, 0, false, map[string]string{
			"open-rdwr": "ok", "accmode": "0", "mmap-private": "ok", "discard-punch": "ok", "discarded-reads": "template",
			"pwrite": "bad file descriptor",
			"fchmod": "read-only file system", "reopen-rdwr": "read-only file system",
			"open-wronly": "read-only file system", "openat-dirfd": "read-only file system",
			"chmod": "read-only file system", "open-other": "ok", "write-other": "ok",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.abi >= 0 {
				kernelABI = func() int { return c.abi }
				defer func() { kernelABI = LandlockABI }()
			} else if LandlockABI() < MinLandlockABI {
				t.Skip("this kernel has no Landlock ABI 2 or later")
			}
			if c.beforeSend {
				was := completesWithAddfd
				completesWithAddfd = func() bool { return false }
				defer func() { completesWithAddfd = was }()
			}
			p, a := cloneSetup(t, content, c.readOnly)
			got := runChild(t, &p, cloneAttackEnv, a)
			testenv.CheckOutcomes(t, got, c.want)
			b, err := os.ReadFile(a.Template)
			var st unix.Stat_t
			if err := unix.Stat(a.Template, &st); err != nil {
				t.Fatal(err)
			}
			changed := err != nil || !bytes.Equal(b, content) || st.Mode&0o7777 != 0o600 || st.Uid != 0
			if changed != !c.readOnly {
				t.Errorf("template after the child: changed %v (%d bytes, starting %q, mode %o, uid %d, %v), want changed %v",
					changed, len(b), b[:min(len(b), 8)], st.Mode&0o7777, st.Uid, err, !c.readOnly)
			}
			if held := heldFDs(t, a.Template); len(held) > 0 {
				t.Errorf("the test process still holds %v after the child", held)
			}
		})
	}
}

// cloneSetup makes, in a new directory, a template's memory file
// holding content, a share holding Other (empty) and an empty root, and
// the child's policy (childPolicy) with the template as a clone's:
// bound read-only and its open answered read-only (readOnly), or
// written, as a clone's policy had it before.
func cloneSetup(tb testing.TB, content []byte, readOnly bool) (Policy, cloneAttack) {
	dir := tb.TempDir()
	a := cloneAttack{Template: filepath.Join(dir, "store", "template.mem"), Other: filepath.Join(dir, "share", "other")}
	for _, d := range []string{"store", "share", "root"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	if err := errors.Join(os.WriteFile(a.Template, content, 0o600), os.WriteFile(a.Other, nil, 0o644)); err != nil {
		tb.Fatal(err)
	}
	p := childPolicy(filepath.Join(dir, "share"), filepath.Join(dir, "root"))
	if readOnly {
		p.Rules = append(p.Rules, Rule{Path: a.Template, Access: Read})
		p.ReadOnlyOpens = []string{a.Template}
	} else {
		p.Rules = append(p.Rules, Rule{Path: a.Template, Access: Write})
	}
	return p, a
}

// heldFDs are this process's descriptors of file or of a seccomp
// listener.
func heldFDs(t *testing.T, file string) []string {
	var want unix.Stat_t
	if err := unix.Stat(file, &want); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, e := range ents {
		fd, _ := strconv.Atoi(e.Name())
		link, _ := os.Readlink("/proc/self/fd/" + e.Name())
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino || strings.Contains(link, "seccomp") {
			held = append(held, e.Name()+" "+link)
		}
	}
	return held
}

// Confine refuses read-only opens it could not keep read-only: without
// a root, or with the file writable by its rule or one above it.
func TestReadOnlyOpensNeedAReadOnlyBind(t *testing.T) {
	for _, c := range []struct {
		name string
		p    Policy
		want string
	}{
		{"no root", Policy{Rules: []Rule{{Path: "/t/memory", Access: Read}}, ReadOnlyOpens: []string{"/t/memory"}},
			"read-only open of /t/memory: the policy has no root of its own to bind it read-only in"},
		{"no rule", Policy{Root: "/r", ReadOnlyOpens: []string{"/t/memory"}},
			"read-only open of /t/memory: the policy has no rule that only reads it"},
		{"writing rule", Policy{Root: "/r", Rules: []Rule{{Path: "/t/memory", Access: Write}}, ReadOnlyOpens: []string{"/t/memory"}},
			"read-only open of /t/memory: the policy has no rule that only reads it"},
		{"writing rule above", Policy{Root: "/r", Rules: []Rule{{Path: "/t/memory", Access: Read}, {Path: "/t", Access: Own}},
			ReadOnlyOpens: []string{"/t/memory"}}, "read-only open of /t/memory: a rule writes beneath it"},
	} {
		if err := checkReadOnlyOpens(c.p); err == nil || err.Error() != c.want {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	ok := Policy{Root: "/r", Rules: []Rule{{Path: "/t/memory", Access: Read}, {Path: "/t/share", Access: Own}}, ReadOnlyOpens: []string{"/t/memory"}}
	if err := checkReadOnlyOpens(ok); err != nil {
		t.Errorf("a read-only bind beside a share: %v", err)
	}
}

// openTimes is what the benchmark's child does: N opens of Template and
// of Other, each for reading and writing, timed.
type openTimes struct {
	Template, Other string
	N               int
}

const openTimesEnv = "HULL_FSGUARD_OPEN_TIMES"

func (o openTimes) run() {
	for _, f := range []struct{ name, path string }{{"template", o.Template}, {"other", o.Other}} {
		start := time.Now()
		for range o.N {
			fd, err := unix.Open(f.path, unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				fmt.Println(f.name, testenv.Outcome(err))
				return
			}
			unix.Close(fd)
		}
		fmt.Println(f.name, time.Since(start).Nanoseconds()/int64(o.N))
	}
}

// What an open for writing costs a confined process: answered
// read-only by the confining process (a clone's template memory),
// passed on by it (every other such open: QEMU makes one, at its
// start), and, side by side, both opens under a policy without
// read-only opens (no second filter).
// go test -run '^$' -bench ReadOnlyOpen ./internal/fsguard (as root)
func BenchmarkReadOnlyOpen(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("root benchmark")
	}
	for _, readOnly := range []bool{true, false} {
		b.Run(fmt.Sprintf("read-only-opens=%v", readOnly), func(b *testing.B) {
			p, a := cloneSetup(b, []byte("x"), readOnly)
			o := openTimes{Template: a.Template, Other: a.Other, N: b.N}
			got := runChild(b, &p, openTimesEnv, o)
			for _, f := range []string{"template", "other"} {
				ns, err := strconv.ParseFloat(got[f], 64)
				if err != nil {
					b.Fatalf("%s: %q", f, got[f])
				}
				b.ReportMetric(ns, "ns/open-"+f)
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// Both numbers of SECCOMP_IOCTL_NOTIF_ID_VALID reach this kernel's
// listener (an id never given is ENOENT; a number it does not know,
// EINVAL): the older one, which kernels before the fix take alone, is the
// one they knew.
func TestIDValidEitherNumber(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root test: run `go test ./internal/fsguard` as root")
	}
	p, _ := cloneSetup(t, []byte("x"), true)
	errs := make(chan []error, 1)
	OnOwnThread(func() {
		c, err := Confine(p)
		if err != nil {
			errs <- []error{err}
			return
		}
		defer c.Close()
		raw, err := c.r.listener.SyscallConn()
		if err != nil {
			errs <- []error{err}
			return
		}
		var got []error
		raw.Control(func(fd uintptr) {
			for _, req := range []uint{unix.SECCOMP_IOCTL_NOTIF_ID_VALID, notifIDValidWrongDir, unix.SECCOMP_IOCTL_NOTIF_ID_VALID + 0x100} {
				id := uint64(1 << 62)
				got = append(got, ioctl(int(fd), req, unsafe.Pointer(&id)))
			}
			got = append(got, idValid(int(fd), 1<<62))
		})
		errs <- got
	})
	got := <-errs
	want := []error{unix.ENOENT, unix.ENOENT, unix.EINVAL, unix.ENOENT}
	if len(got) != len(want) {
		t.Fatalf("confining: %v", got)
	}
	for i := range want {
		if !errors.Is(got[i], want[i]) {
			t.Errorf("request %d: %v, want %v", i, got[i], want[i])
		}
	}
}

func TestReadOnlyOpensKernels(t *testing.T) {
	for release, want := range map[string]string{
		"6.1.0-28-amd64": "", "5.10.0-32-amd64": "", "5.9.0": "",
		"5.8.18": `read-only opens need Linux 5.9 or later (SECCOMP_IOCTL_NOTIF_ADDFD); this kernel is "5.8.18"`,
	} {
		err := readOnlyOpensOn(release)
		if got := fmt.Sprint(err); err == nil && want != "" || err != nil && got != want {
			t.Errorf("%s: %v, want %q", release, err, want)
		}
	}
}

func TestKernelAtLeast(t *testing.T) {
	for release, want := range map[string]bool{
		"6.1.0-28-amd64": true, "5.14.0-70.el9.x86_64": true, "5.15.0": true, "5.13.19": false,
		"4.19.0-27-amd64": false, "10.0": true, "garbage": false,
	} {
		if got := kernelAtLeast(release, 5, 14); got != want {
			t.Errorf("kernelAtLeast(%q, 5, 14) = %v, want %v", release, got, want)
		}
	}
}
