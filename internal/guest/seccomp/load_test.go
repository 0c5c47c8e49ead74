package seccomp

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestKernelLoad loads containerd's default profile in a child process
// (under no_new_privs, so no privilege is needed): the kernel accepts the
// program, and unshare and keyctl fail with EPERM while getpid works.
func TestKernelLoad(t *testing.T) {
	if os.Getenv("HULL_SECCOMP_CHILD") == "1" {
		loadChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKernelLoad$", "-test.v")
	cmd.Env = append(os.Environ(), "HULL_SECCOMP_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CHILD OK") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func loadChild() {
	fail := func(format string, args ...any) {
		os.Stdout.WriteString("CHILD FAIL: " + strings.TrimSpace(sprintf(format, args...)) + "\n")
		os.Exit(1)
	}
	runtime.LockOSThread()
	s, err := readProfile("testdata/containerd-default.json")
	if err != nil {
		fail("%v", err)
	}
	f, err := New(s)
	if err != nil {
		fail("%v", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fail("no_new_privs: %v", err)
	}
	if err := f.Load(); err != nil {
		fail("%v", err)
	}
	status, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		fail("%v", err)
	}
	if !strings.Contains(string(status), "\nSeccomp:\t2\n") {
		fail("no Seccomp: 2 in status")
	}
	if err := unix.Unshare(unix.CLONE_NEWUTS); !errors.Is(err, unix.EPERM) {
		fail("unshare: got %v, want EPERM", err)
	}
	if _, _, e := unix.Syscall(unix.SYS_KEYCTL, 0, 0, 0); e != unix.EPERM {
		fail("keyctl: got %v, want EPERM", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_CLONE3, 0, 0, 0); e != unix.ENOSYS {
		fail("clone3: got %v, want ENOSYS", e)
	}
	if unix.Getpid() != os.Getpid() {
		fail("getpid")
	}
	os.Stdout.WriteString("CHILD OK\n")
	os.Exit(0)
}
