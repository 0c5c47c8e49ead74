package qemu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/testenv"
	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu/qmp"
)

// helperEnv makes the test binary a helper that starts a VM in the
// directory it names, prints QEMU's pid and waits to be killed.
const helperEnv = "HULL_QEMU_TEST_HELPER_DIR"

func TestMain(m *testing.M) {
	if isFallenQEMU() {
		os.Exit(fallenMain())
	}
	if dir := os.Getenv(helperEnv); dir != "" {
		os.Exit(helperMain(dir))
	}
	if path := os.Getenv(openEnv); path != "" {
		_, err := os.OpenFile(path, os.O_RDWR, 0)
		fmt.Println("open", testenv.Outcome(err))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func helperMain(dir string) int {
	q, err := New(vm.Config{
		ID: "helper", Dir: dir, VCPUs: 1, MemoryMiB: 128,
		Kernel: os.Getenv("HULL_TEST_KERNEL"), Initrd: os.Getenv("HULL_QEMU_TEST_HELPER_INITRD"),
		KernelParams: []string{"rdinit=/nonexistent-hull-test", "panic=0"},
	}, nil)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := q.Start(ctx); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("pid", q.Pid())
	select {} // until SIGKILLed
}

// testAssets returns the kernel and an initrd, skipping the test
// without a kernel.
func testAssets(t testing.TB) (kernel, initrd string) {
	t.Helper()
	k, why := testenv.Env("HULL_TEST_KERNEL")
	testenv.Require(t, testenv.Bins("qemu-system-x86_64"), why)
	kernel = k[0]
	initrd = os.Getenv("HULL_TEST_INITRD")
	if initrd == "" {
		initrd = filepath.Join(t.TempDir(), "empty.cpio")
		if err := os.WriteFile(initrd, emptyCpio(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return kernel, initrd
}

// emptyCpio is a newc archive holding only its trailer.
func emptyCpio() []byte {
	var b bytes.Buffer
	name := "TRAILER!!!\x00"
	fmt.Fprintf(&b, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, len(name), 0)
	b.WriteString(name)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	for b.Len()%512 != 0 {
		b.WriteByte(0)
	}
	return b.Bytes()
}

// logBuffer collects log lines for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startVM boots kernel with params (which must keep it from finding an
// init) and registers a cleanup that stops QEMU and checks that it left
// no process and no socket behind.
func startVM(t *testing.T, machine string, params ...string) (*QEMU, *logBuffer) {
	t.Helper()
	kernel, initrd := testAssets(t)
	dir := t.TempDir()
	logs := &logBuffer{}
	q, err := New(vm.Config{
		ID: "test-" + machine, Dir: dir, MachineType: machine, VCPUs: 1, MemoryMiB: 128,
		Kernel: kernel, Initrd: initrd, KernelParams: params,
		ConsoleOutput: func(line string) { fmt.Fprintf(logs, "console: %s\n", line) },
	}, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if err := q.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: qmp ready after %v, qemu %s, pid %d", machine, time.Since(start).Round(time.Millisecond), q.Version(), q.Pid())
	t.Cleanup(func() {
		pid := q.Pid()
		if err := q.Stop(context.Background(), 5*time.Second); err != nil {
			t.Error(err)
		}
		assertGone(t, pid, 2*time.Second)
		for _, s := range []string{q.QMPSocket(), q.AgentSocket()} {
			if _, err := os.Stat(s); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("socket %s left behind (%v)", s, err)
			}
		}
		if t.Failed() {
			t.Logf("driver log:\n%s", logs)
			b, _ := os.ReadFile(filepath.Join(dir, qemuLogName))
			t.Logf("qemu.log:\n%s", b)
			b, _ = os.ReadFile(q.ConsoleLog())
			t.Logf("console.log:\n%s", b)
		}
	})
	return q, logs
}

// assertGone fails unless pid is gone (or a zombie) within d.
func assertGone(t *testing.T, pid int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		// Fields after the command name in parentheses: state first.
		if i := bytes.LastIndexByte(b, ')'); i > 0 && i+2 < len(b) && b[i+2] == 'Z' {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("qemu pid %d still running %v later", pid, d)
			syscall.Kill(pid, syscall.SIGKILL)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitConsole waits until the guest console holds s.
func waitConsole(t *testing.T, q *QEMU, s string, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < d {
		if b, _ := os.ReadFile(q.ConsoleLog()); bytes.Contains(b, []byte(s)) {
			return time.Since(start)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("console never showed %q within %v", s, d)
	return 0
}

// A guest that finds no init panics; with panic=1 and -no-reboot QEMU
// exits on its own, and Done must say so.
func TestPanicExitClosesDone(t *testing.T) {
	q, logs := startVM(t, MachineQ35, "rdinit=/nonexistent-hull-test")
	select {
	case <-q.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("qemu did not exit after the guest panicked")
	}
	b, _ := os.ReadFile(q.ConsoleLog())
	if !bytes.Contains(b, []byte("Kernel panic")) {
		t.Errorf("console has no panic:\n%s", b)
	}
	// ConsoleTail has it too, by the time Done closed.
	if tail := strings.Join(q.ConsoleTail(20), "\n"); !strings.Contains(tail, "Kernel panic") {
		t.Errorf("ConsoleTail has no panic:\n%s", tail)
	}
	// The same line reached ConsoleOutput, by the time Done closed.
	if !strings.Contains(logs.String(), "console: ") || !strings.Contains(logs.String(), "Kernel panic") {
		t.Errorf("ConsoleOutput did not get the panic; driver log:\n%s", logs)
	}
	if err := q.ExitError(); err != nil {
		t.Errorf("exit status %v", err)
	}
	if _, err := q.QMP().Execute(context.Background(), "query-status", nil, nil), q.QMP().Err(); !errors.Is(err, qmp.ErrClosed) {
		t.Errorf("qmp after exit: %v", err)
	}
	if kvmUsable() != nil {
		if n := strings.Count(logs.String(), "kvm unusable"); n != 1 {
			t.Errorf("%d kvm warnings, want one; logs:\n%s", n, logs)
		}
	}
	// Stop after death is a no-op.
	if err := q.Stop(context.Background(), time.Second); err != nil {
		t.Error(err)
	}
}

// A panicked guest with panic=0 loops forever and ignores the power
// button: Stop must kill it once grace is over, and concurrent and
// repeated Stops must all return.
func TestStopKillsWithinGrace(t *testing.T) {
	for _, machine := range []string{MachineQ35, MachineMicrovm} {
		t.Run(machine, func(t *testing.T) {
			q, _ := startVM(t, machine, "rdinit=/nonexistent-hull-test", "panic=0")
			var st struct {
				Status string `json:"status"`
			}
			if err := q.QMP().Execute(context.Background(), "query-status", nil, &st); err != nil {
				t.Fatal(err)
			}
			if st.Status != "running" {
				t.Errorf("status %q", st.Status)
			}
			waitConsole(t, q, "Kernel panic", 60*time.Second)

			const grace = 1500 * time.Millisecond
			start := time.Now()
			var wg sync.WaitGroup
			for range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := q.Stop(context.Background(), grace); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			if d := time.Since(start); d < grace || d > grace+time.Second {
				t.Errorf("stop took %v, want just over %v", d, grace)
			}
			select {
			case <-q.Done():
			default:
				t.Error("Done not closed after Stop")
			}
			if err := q.Stop(context.Background(), grace); err != nil {
				t.Error(err)
			}
		})
	}
}

// Stop honours ctx's deadline when grace is longer.
func TestStopHonoursContextDeadline(t *testing.T) {
	q, _ := startVM(t, MachineQ35, "rdinit=/nonexistent-hull-test", "panic=0")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := q.Stop(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("stop took %v with a 300ms deadline", d)
	}
}

// QEMU's own error message reaches the caller when it exits during start.
func TestStartErrorQuotesQEMU(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	dir := t.TempDir()
	kernel := filepath.Join(dir, "not-a-kernel")
	os.WriteFile(kernel, []byte("hello"), 0o644)
	q, err := New(vm.Config{ID: "bad", Dir: dir, VCPUs: 1, MemoryMiB: 64, Kernel: kernel, Accel: "tcg"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = q.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), "invalid kernel header") {
		t.Fatalf("got %v, want qemu's message", err)
	}
	t.Log(err)
	select {
	case <-q.Done():
	default:
		t.Error("Done not closed after a failed start")
	}
	for _, s := range []string{q.QMPSocket(), q.AgentSocket()} {
		if _, err := os.Stat(s); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s left behind", s)
		}
	}
}

// QEMU must die with the process that started it, even when that
// process is SIGKILLed.
func TestQEMUDiesWithSIGKILLedParent(t *testing.T) {
	_, initrd := testAssets(t)
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+dir, "HULL_QEMU_TEST_HELPER_INITRD="+initrd)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "pid ") {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper said %q (%v)", line, err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("qemu pid %d not running: %v", pid, err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	assertGone(t, pid, 2*time.Second)
	// A SIGKILLed QEMU leaves its sockets (releasing them is the state
	// owner's job: shim delete, hull gc) but no mount: its root was its
	// own mount namespace's.
	if ms := leakcheck.Mounts([]string{dir}); len(ms) != 0 {
		t.Errorf("mounts left under %s by a QEMU killed with its parent: %q", dir, ms)
	}
	// Shims before 2026-12-05 left a /proc/<pid>/fd bind mount there; its
	// releaser, as gc runs it, unmounts it.
	procfd := filepath.Join(dir, rootName, "proc", "self", "fd")
	if err := os.MkdirAll(procfd, 0o500); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("/proc/self/fd", procfd, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := releaseProcFDMount(context.Background(), state.Resource{Kind: KindProcFDMount, Key: procfd}); err != nil {
		t.Fatal(err)
	}
	if ms := leakcheck.Mounts([]string{dir}); len(ms) != 0 {
		t.Errorf("%q still mounted after its release", ms)
	}
	if err := releaseProcFDMount(context.Background(), state.Resource{Kind: KindProcFDMount, Key: dir}); err == nil {
		t.Errorf("releasing %s as a qemu-root/proc/self/fd mount: no error", dir)
	}
}

// BenchmarkBoot measures QEMU start-up (until QMP answers) and the guest
// kernel's boot (until its panic line for a missing init) per kernel
// format and machine type: `go test -run - -bench Boot ./internal/vm/qemu`
// with HULL_TEST_KERNEL (and optionally HULL_TEST_VMLINUX, an uncompressed
// vmlinux, and HULL_TEST_PARAMS, extra kernel parameters).
func BenchmarkBoot(b *testing.B) {
	kernel, initrd := testAssets(b)
	kernels := map[string]string{"bzImage": kernel}
	if v := os.Getenv("HULL_TEST_VMLINUX"); v != "" {
		kernels["vmlinux"] = v
	}
	extra := strings.Fields(os.Getenv("HULL_TEST_PARAMS"))
	for _, kname := range []string{"bzImage", "vmlinux"} {
		k, ok := kernels[kname]
		if !ok {
			continue
		}
		for _, machine := range Machines {
			b.Run(kname+"/"+machine, func(b *testing.B) {
				var qmpT, panicT []time.Duration
				for range b.N {
					q, err := New(vm.Config{
						ID: "m", Dir: b.TempDir(), MachineType: machine, VCPUs: 1, MemoryMiB: 128,
						Kernel: k, Initrd: initrd,
						KernelParams: append([]string{"rdinit=/nonexistent-hull-test", "panic=0"}, extra...),
					}, nil)
					if err != nil {
						b.Fatal(err)
					}
					start := time.Now()
					if err := q.Start(context.Background()); err != nil {
						b.Fatal(err)
					}
					qmpT = append(qmpT, time.Since(start))
					for time.Since(start) < 30*time.Second {
						if out, _ := os.ReadFile(q.ConsoleLog()); bytes.Contains(out, []byte("Kernel panic")) {
							panicT = append(panicT, time.Since(start))
							break
						}
						time.Sleep(5 * time.Millisecond)
					}
					q.Stop(context.Background(), 0)
				}
				b.ReportMetric(float64(median(qmpT).Milliseconds()), "ms-qmp-p50")
				b.ReportMetric(float64(median(panicT).Milliseconds()), "ms-kernel-p50")
				if len(panicT) < len(qmpT) {
					b.Errorf("%d of %d boots never reached the kernel's panic line", len(qmpT)-len(panicT), len(qmpT))
				}
			})
		}
	}
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2].Round(time.Millisecond)
}
