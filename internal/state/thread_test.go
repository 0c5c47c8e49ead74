package state

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// leaderExitsEnv makes the test binary a process whose main thread
// exits while another of its threads runs on: its /proc/<pid>/stat says
// zombie, as a SIGKILLed multi-threaded process's does while its last
// threads are still exiting (and still in its cgroup).
const leaderExitsEnv = "HULL_STATE_LEADER_EXITS"

func init() {
	if os.Getenv(leaderExitsEnv) == "" {
		return
	}
	// init runs on the main thread, locked to it.
	ready := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		close(ready)
		for {
			unix.RawSyscall(unix.SYS_PAUSE, 0, 0, 0)
		}
	}()
	<-ready
	fmt.Println("ready")
	unix.RawSyscall(unix.SYS_EXIT, 0, 0, 0) // this thread only
}

// A process whose main thread has exited is not released until every
// thread of it has: ReleaseProcess kills the threads left and waits for
// them, so that its cgroup can be removed next.
func TestReleaseProcessWaitsForEveryThread(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), leaderExitsEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	t.Cleanup(func() { cmd.Process.Kill(); <-waited })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("child: %q, %v", line, err)
	}
	go func() { cmd.Wait(); close(waited) }()
	pid := cmd.Process.Pid
	start, err := ProcessStartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		if state, _, err := procStat(pid); err == nil && state == 'Z' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the child's main thread did not exit")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := threads(pid); n < 2 {
		t.Fatalf("the child has %d threads, want its zombie leader and more", n)
	}
	if exited(pid, start, -1) {
		t.Error("without a pidfd, a zombie leader with threads left counts as exited")
	}
	if err := ReleaseProcess(context.Background(), Resource{Kind: KindProcess, Key: "leader-exits", Pid: pid, StartTime: start}); err != nil {
		t.Fatal(err)
	}
	if n := threads(pid); n > 1 {
		t.Errorf("ReleaseProcess returned with %d threads of the process left", n)
	}
	if !exited(pid, start, -1) {
		t.Error("without a pidfd, the released process does not count as exited")
	}
}

// threads counts pid's threads, its zombie leader included (0 once it
// is reaped).
func threads(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	return len(ents)
}
