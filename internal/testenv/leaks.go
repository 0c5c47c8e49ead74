package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/stacks"
)

// RunCheckingLeaks runs a package's tests (for TestMain: os.Exit of it)
// and then fails them if they left goroutines running or descriptors
// open that were not there before: a leak in the code under test, or in
// a test that does not clean up after itself. The check waits up to
// leakSettle for what is shutting down to finish. lifelong names the
// functions of goroutines that live as long as the process by design
// (started once, on first use), which are not leaks.
func RunCheckingLeaks(m *testing.M, lifelong ...string) int {
	before := TakeSnapshot()
	code := m.Run()
	if code != 0 {
		return code
	}
	if leaks := before.Leaks(leakSettle, lifelong...); len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the tests left behind:\n%s\n", strings.Join(leaks, "\n"))
		return 1
	}
	return 0
}

const leakSettle = 5 * time.Second

// Snapshot is what runs and is open in this process at one moment.
type Snapshot struct {
	goroutines map[string]bool // ids
	fds        map[string]string
}

// TakeSnapshot records the goroutines and open descriptors now.
func TakeSnapshot() Snapshot {
	s := Snapshot{goroutines: map[string]bool{}, fds: openFDs()}
	for id := range goroutineStacks() {
		s.goroutines[id] = true
	}
	return s
}

// Leaks is what runs or is open now and was not at s, waiting up to
// settle for it to go: each goroutine's stack (but those running one of
// the lifelong functions), each descriptor's target.
func (s Snapshot) Leaks(settle time.Duration, lifelong ...string) []string {
	deadline := time.Now().Add(settle)
	for {
		var leaks []string
		for id, stack := range goroutineStacks() {
			if !s.goroutines[id] && !expectedGoroutine(stack, lifelong) {
				leaks = append(leaks, "goroutine "+stack)
			}
		}
		for fd, target := range openFDs() {
			if s.fds[fd] != target && !expectedFD(target) {
				leaks = append(leaks, fmt.Sprintf("descriptor %s -> %s", fd, target))
			}
		}
		if len(leaks) == 0 || time.Now().After(deadline) {
			slices.Sort(leaks)
			return leaks
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// expectedGoroutine: the runtime's and the testing package's own, which
// live as long as the process once started.
func expectedGoroutine(stack string, lifelong []string) bool {
	for _, f := range append(lifelong, "os/signal.loop", "os/signal.signal_recv", "testing.(*M).", "testing.runTests", "runtime.ensureSigM") {
		if strings.Contains(stack, f) {
			return true
		}
	}
	return false
}

// expectedFD: the Go runtime's network poller, created at the first
// network or pipe use and kept.
func expectedFD(target string) bool {
	return target == "anon_inode:[eventpoll]" || target == "anon_inode:[eventfd]"
}

// goroutineStacks maps each goroutine's id to its stack ("ID [state]:
// frames"), this one's excepted.
func goroutineStacks() map[string]string {
	out := map[string]string{}
	for i, g := range strings.Split(string(stacks.All()), "\n\n") {
		if i == 0 {
			continue // the calling goroutine
		}
		g = strings.TrimPrefix(g, "goroutine ")
		id, _, _ := strings.Cut(g, " ")
		out[id] = g
	}
	return out
}

// openFDs maps this process's open descriptors to what they refer to.
func openFDs() map[string]string {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, e := range ents {
		if t, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil {
			out[e.Name()] = t
		}
	}
	// The descriptor ReadDir read /proc/self/fd through.
	for fd, t := range out {
		if strings.HasPrefix(t, "/proc/") && strings.HasSuffix(t, "/fd") {
			delete(out, fd)
		}
	}
	return out
}
