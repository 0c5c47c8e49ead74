package testenv

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestLeaksSeesGoroutinesAndDescriptors(t *testing.T) {
	s := TakeSnapshot()
	stop := make(chan struct{})
	go func() { <-stop }()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	leaks := strings.Join(s.Leaks(100*time.Millisecond), "\n")
	if !strings.Contains(leaks, "TestLeaksSeesGoroutinesAndDescriptors") || !strings.Contains(leaks, "/status") {
		t.Errorf("a running goroutine and an open file not reported:\n%s", leaks)
	}
	close(stop)
	f.Close()
	if leaks := s.Leaks(2 * time.Second); len(leaks) > 0 {
		t.Errorf("reported after the goroutine ended and the file closed:\n%s", strings.Join(leaks, "\n"))
	}
}
