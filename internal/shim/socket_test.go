package shim

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
)

func TestShimServes(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live")
	l, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !shimServes("unix://" + live) {
		t.Error("a listening socket is not served")
	}
	// A socket file nobody listens on (a SIGKILLed shim's).
	dead := filepath.Join(dir, "dead")
	dl, err := net.Listen("unix", dead)
	if err != nil {
		t.Fatal(err)
	}
	dl.(*net.UnixListener).SetUnlinkOnClose(false)
	dl.Close()
	if shimServes("unix://" + dead) {
		t.Error("a socket nobody listens on is served")
	}
	if shimServes("unix://" + filepath.Join(dir, "none")) {
		t.Error("a missing socket is served")
	}
	// A dial that times out is a slow shim, not a dead one.
	slow := func(string) error { return context.DeadlineExceeded }
	if !shimServesWith("unix://"+live, slow) {
		t.Error("a slow answer was taken for a dead shim")
	}
	if _, err := os.Stat(dead); err != nil {
		t.Fatal(err)
	}
}
