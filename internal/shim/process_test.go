package shim

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Output written while containerd restarts (the FIFO has no reader for a
// moment) must wait for the next reader, not end the copy: the test's
// writer writes "2" between the first reader's close and the second's
// open.
func TestOutputSurvivesReaderRestart(t *testing.T) {
	path := newFifo(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// containerd's end: non-blocking, so the open does not wait for the
	// writer.
	openReader := func() *os.File {
		f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	line := func(r *bufio.Reader) string {
		for {
			s, err := r.ReadString('\n')
			if err == nil {
				return s
			}
			if ctx.Err() != nil {
				t.Fatalf("no line (%q so far): %v", s, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	step := make(chan string)
	done := make(chan error, 1)
	r1f := openReader()
	go func() {
		done <- pumpOut(ctx, path, func(w io.Writer) error {
			for s := range step {
				if _, err := io.WriteString(w, s); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	r1 := bufio.NewReader(r1f)
	step <- "1\n"
	if got := line(r1); got != "1\n" {
		t.Fatalf("first reader got %q", got)
	}
	r1f.Close() // containerd stops
	select {
	case step <- "2\n":
	case err := <-done:
		t.Fatalf("the copy ended when its reader went away: %v", err)
	}
	time.Sleep(50 * time.Millisecond)
	r2 := bufio.NewReader(openReader()) // containerd is back
	select {
	case step <- "3\n":
	case err := <-done:
		t.Fatalf("the copy ended while no reader was there: %v", err)
	}
	if got := line(r2) + line(r2); got != "2\n3\n" {
		t.Fatalf("second reader got %q, want the lines written without a reader and after", got)
	}
	close(step)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// containerd opens its end of an output FIFO in a goroutine of its own,
// which may run after the process has written everything and exited. The
// output must wait for that reader, not be written into a FIFO nobody
// reads and closed: the reader's open then waits for a writer for good,
// and containerd with it (an ExecSync that never returns). With no output
// at all the late reader must still see the end.
func TestOutputWaitsForALateReader(t *testing.T) {
	for _, out := range []string{"seed-content-03", ""} {
		path := newFifo(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		done := make(chan error, 1)
		go func() {
			done <- pumpOut(ctx, path, func(w io.Writer) error {
				_, err := io.WriteString(w, out)
				return err
			})
		}()
		time.Sleep(200 * time.Millisecond) // containerd's goroutine is late
		got := make(chan string, 1)
		go func() {
			f, err := os.OpenFile(path, os.O_RDONLY, 0) // blocks until a writer comes
			if err != nil {
				got <- "open: " + err.Error()
				return
			}
			defer f.Close()
			b, err := io.ReadAll(f)
			if err != nil {
				got <- "read: " + err.Error()
				return
			}
			got <- string(b)
		}()
		select {
		case s := <-got:
			if s != out {
				t.Errorf("late reader got %q, want %q", s, out)
			}
		case <-time.After(3 * time.Second):
			t.Errorf("output %q: the late reader never got to the end (its open waits for a writer that closed)", out)
			cancel()
			// Let the stuck open go: a writer that comes and goes.
			if w, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close()
			}
		}
		if err := <-done; err != nil {
			t.Errorf("output %q: %v", out, err)
		}
		cancel()
	}
}

// A reader that never comes ends the wait with ctx, and the error names
// the FIFO.
func TestOutputWithoutAReaderNamesTheFifo(t *testing.T) {
	path := newFifo(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	wrote := false
	err := pumpOut(ctx, path, func(io.Writer) error { wrote = true; return nil })
	if err == nil || !strings.Contains(err.Error(), path) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("pumpOut with no reader: %v, want the deadline and %s", err, path)
	}
	if wrote {
		t.Error("the copy ran with no reader")
	}
}

// newFifo makes a FIFO named stdout in a directory of the test's own, as
// containerd makes a container's.
func newFifo(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stdout")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
