package agentclient

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// A VM that exits while the host waits for its agent ends the wait at once
// with ErrVMExited, not at the deadline.
func TestDialGivesUpWhenTheVMExits(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { // QEMU's side: accepts, and the guest never answers
		c, err := l.Accept()
		if err == nil {
			defer c.Close()
			time.Sleep(10 * time.Second)
		}
	}()
	vmDone := make(chan struct{})
	time.AfterFunc(100*time.Millisecond, func() { close(vmDone) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, _, err = Dial(ctx, sock, vmDone)
	if !errors.Is(err, ErrVMExited) {
		t.Fatalf("err = %v, want ErrVMExited", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Dial took %v after the VM exited", d)
	}

	// Without a VM signal, the deadline bounds the wait.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if _, _, err := Dial(ctx2, sock, nil); err == nil || errors.Is(err, ErrVMExited) {
		t.Fatalf("err = %v, want the deadline", err)
	}
}
