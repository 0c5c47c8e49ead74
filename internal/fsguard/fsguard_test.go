package fsguard

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMain doubles as the child that runs with the filter installed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("HULL_FSGUARD_CHILD"); dir != "" {
		runtime.LockOSThread() // child's syscalls run on this thread
		if err := InstallThread(); err != nil {
			fmt.Println("install:", err)
			os.Exit(1)
		}
		child(dir)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child tries what guest root would ask of QEMU's file server and prints
// one "name errno" line per attempt ("ok" when it succeeded).
func child(dir string) {
	p := func(n string) string { return filepath.Join(dir, n) }
	report := func(name string, err error) {
		if err == nil {
			fmt.Println(name, "ok")
			return
		}
		fmt.Println(name, err.(unix.Errno).Error())
	}
	report("mknod-blk", unix.Mknod(p("blk"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))))
	report("mknodat-chr", unix.Mknodat(unix.AT_FDCWD, p("chr"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))))
	report("mknod-fifo", unix.Mknod(p("fifo"), unix.S_IFIFO|0o600, 0))
	fd, err := unix.Open(p("file"), unix.O_CREAT|unix.O_WRONLY, 0o755)
	report("open-plain", err)
	if err == nil {
		report("fchmod-suid", unix.Fchmod(fd, 0o4755))
		unix.Close(fd)
	}
	report("chmod-plain", unix.Chmod(p("file"), 0o700))
	report("chmod-suid", unix.Chmod(p("file"), 0o4755))
	report("fchmodat-sgid", unix.Fchmodat(unix.AT_FDCWD, p("file"), 0o2755, 0))
	_, err = unix.Openat(unix.AT_FDCWD, p("suid-new"), unix.O_CREAT|unix.O_WRONLY, 0o4755)
	report("openat-suid", err)
	report("setxattr", unix.Setxattr(p("file"), "security.capability", []byte{1}, 0))
	report("lsetxattr", unix.Lsetxattr(p("file"), "user.x", []byte{1}, 0))
}

func TestFilter(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root test (mknod of devices): run `go test ./internal/fsguard` as root")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "HULL_FSGUARD_CHILD="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			got[k] = v
		}
	}
	want := map[string]string{
		"mknod-blk": "operation not permitted", "mknodat-chr": "operation not permitted", "mknod-fifo": "ok",
		"open-plain": "ok", "fchmod-suid": "operation not permitted", "chmod-plain": "ok",
		"chmod-suid": "operation not permitted", "fchmodat-sgid": "operation not permitted",
		"openat-suid": "operation not permitted", "setxattr": "operation not supported", "lsetxattr": "operation not supported",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "file"), &st); err != nil || st.Mode&0o7777 != 0o700 {
		t.Errorf("file mode %#o (%v), want 0700", st.Mode&0o7777, err)
	}
}

// The filter is the installing thread's and its children's: the process's
// other threads (the shim's, which serve containerd) have none, and a
// process the thread starts has it from its first instruction.
func TestInstallThreadFiltersOnlyItsThread(t *testing.T) {
	type result struct {
		tid    int
		status string
		child  []byte
		err    error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		r := result{tid: unix.Gettid()}
		if r.err = InstallThread(); r.err == nil {
			r.child, r.err = exec.Command("grep", "-E", "^(Seccomp_filters|NoNewPrivs):", "/proc/self/status").Output()
		}
		res <- r
	}()
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if want := "NoNewPrivs:\t1\nSeccomp_filters:\t1\n"; string(r.child) != want {
		t.Errorf("a child of the thread: %q, want %q", r.child, want)
	}
	// The test's own threads: none filtered (the installing one has ended).
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if task.Name() == strconv.Itoa(r.tid) {
			continue
		}
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/status")
		if err != nil {
			continue // exited meanwhile
		}
		if !strings.Contains(string(b), "\nSeccomp:\t0\n") || !strings.Contains(string(b), "\nNoNewPrivs:\t0\n") {
			t.Errorf("thread %s of the process is filtered too:\n%s", task.Name(), b)
		}
	}
}
