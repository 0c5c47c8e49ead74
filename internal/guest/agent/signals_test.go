package agent

import (
	"bufio"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestIgnoreSignals: after ignoreSignals a process survives the signals
// whose default (or Go's) action ends it, and still gets SIGCHLD.
func TestIgnoreSignals(t *testing.T) {
	if os.Getenv("HULL_IGNORE_CHILD") == "1" {
		ignoreSignalsChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestIgnoreSignals$")
	cmd.Env = append(os.Environ(), "HULL_IGNORE_CHILD=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	r := bufio.NewReader(stdout)
	if l, err := r.ReadString('\n'); err != nil || l != "ready\n" {
		t.Fatalf("child: %q %v", l, err)
	}
	for _, s := range []syscall.Signal{unix.SIGTERM, unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2, unix.SIGPIPE, unix.SIGALRM, unix.SIGSEGV, unix.SIGABRT, syscall.Signal(40)} {
		if err := cmd.Process.Signal(s); err != nil {
			t.Fatalf("sending %v: %v", s, err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	stdin.Write([]byte("go\n"))
	rest, _ := r.ReadString('\n')
	if rest != "sigchld\n" {
		t.Fatalf("child after the signals: %q", rest)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
}

func ignoreSignalsChild() {
	ignoreSignals()
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, unix.SIGCHLD)
	os.Stdout.WriteString("ready\n")
	line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	if strings.TrimSpace(line) != "go" {
		os.Exit(3)
	}
	if err := exec.Command("true").Run(); err != nil {
		os.Exit(4)
	}
	select {
	case <-chld:
		os.Stdout.WriteString("sigchld\n")
		os.Exit(0)
	case <-time.After(10 * time.Second):
		os.Exit(5)
	}
}
