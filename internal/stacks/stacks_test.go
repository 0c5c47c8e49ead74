package stacks

import (
	"strings"
	"testing"
)

// The dump holds every goroutine, even past the first buffer's size.
func TestAllIsWhole(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	for range 2000 {
		go func() { <-stop }()
	}
	s := string(All())
	if n := strings.Count(s, "goroutine "); n < 2001 {
		t.Errorf("%d goroutines in the dump, want over 2000", n)
	}
	if !strings.Contains(s, "TestAllIsWhole") {
		t.Error("the calling goroutine is missing")
	}
}
