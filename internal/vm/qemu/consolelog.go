package qemu

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The guest writes its console as fast as it likes; what that costs the
// host is bounded here (docs/security.md, "QEMU confinement").
const (
	// ConsoleLogMax caps console.log; when a write would pass it, the
	// file becomes console.log.1 (replacing the previous one) and a new
	// console.log starts: at most 2 × ConsoleLogMax on disk.
	ConsoleLogMax = 1 << 20
	// consoleLinesPerSec and consoleBurst rate-limit the lines handed to
	// vm.Config.ConsoleOutput (the shim's log, containerd's log): a
	// token bucket refilled at consoleLinesPerSec, holding consoleBurst
	// (a boot's worth of kernel messages).
	consoleLinesPerSec = 100
	consoleBurst       = 500
)

// rotatedSuffix names the previous console log: console.log.1.
const rotatedSuffix = ".1"

// rotatingLog is console.log: an io.Writer that keeps at most max bytes
// in path and the max before them in path.1. It never fails its caller
// (the console copier must keep draining QEMU's stdout): after an error
// it drops what it is given and reports the error once through onErr.
type rotatingLog struct {
	path  string
	max   int64
	f     *os.File
	size  int64
	err   error
	onErr func(error)
}

// openRotatingLog truncates path and returns a log writing to it.
func openRotatingLog(path string, max int64) (*rotatingLog, error) {
	f, err := openLogFile(path)
	if err != nil {
		return nil, err
	}
	return &rotatingLog{path: path, max: max, f: f}, nil
}

func openLogFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o640)
}

// Write appends p, rotating first when p would not fit. A p longer than
// max is cut to its last max bytes.
func (w *rotatingLog) Write(p []byte) (int, error) {
	n := len(p)
	if w.err != nil {
		return n, nil
	}
	if int64(len(p)) > w.max {
		p = p[int64(len(p))-w.max:]
	}
	if w.size > 0 && w.size+int64(len(p)) > w.max {
		if err := w.rotate(); err != nil {
			w.fail(err)
			return n, nil
		}
	}
	m, err := w.f.Write(p)
	w.size += int64(m)
	if err != nil {
		w.fail(fmt.Errorf("writing %s: %w", w.path, err))
	}
	return n, nil
}

// rotate renames the log to path.1 and starts an empty one.
func (w *rotatingLog) rotate() error {
	w.f.Close()
	if err := os.Rename(w.path, w.path+rotatedSuffix); err != nil {
		return fmt.Errorf("rotating %s: %w", w.path, err)
	}
	f, err := openLogFile(w.path)
	if err != nil {
		return fmt.Errorf("rotating %s: %w", w.path, err)
	}
	w.f, w.size = f, 0
	return nil
}

func (w *rotatingLog) fail(err error) {
	w.err = err
	if w.onErr != nil {
		w.onErr(err)
	}
}

// Close closes the current file.
func (w *rotatingLog) Close() error { return w.f.Close() }

// lineLimiter is a token bucket over console lines, which counts the
// lines it refuses and has them reported at most once per
// dropReportEvery.
type lineLimiter struct {
	perSec, burst float64
	tokens        float64
	last          time.Time
	now           func() time.Time
	// dropped counts the lines refused since the last report.
	dropped    int
	lastReport time.Time
}

// dropReportEvery is how often dropped lines are reported, at most.
const dropReportEvery = time.Second

func newLineLimiter(perSec, burst int) *lineLimiter {
	return &lineLimiter{perSec: float64(perSec), burst: float64(burst), tokens: float64(burst), now: time.Now}
}

// allow reports whether the next line may be forwarded.
func (l *lineLimiter) allow() bool {
	t := l.now()
	if !l.last.IsZero() {
		l.tokens = min(l.burst, l.tokens+t.Sub(l.last).Seconds()*l.perSec)
	}
	l.last = t
	if l.tokens < 1 {
		l.dropped++
		return false
	}
	l.tokens--
	return true
}

// report returns the number of lines dropped since the last report when
// there are some and a report is due (force: now, as at the end), else 0.
func (l *lineLimiter) report(force bool) int {
	if l.dropped == 0 || !force && l.now().Sub(l.lastReport) < dropReportEvery {
		return 0
	}
	n := l.dropped
	l.dropped, l.lastReport = 0, l.now()
	return n
}

// droppedMessage is the line forwarded in place of n dropped ones.
func droppedMessage(n int) string {
	return fmt.Sprintf("[hull: %d guest console lines not forwarded (more than %d lines/s); console.log has them]", n, consoleLinesPerSec)
}

// consoleCoalesce is how long the console copier waits after a short
// read before reading again. QEMU's serial port writes the guest's bytes
// to the pipe one at a time; reading them as they come would cost the
// shim two system calls per byte. An idle console costs nothing: the
// wait follows a read, it never polls.
const consoleCoalesce = 20 * time.Millisecond

// coalescingReader delays the read after a short one, so that the pipe
// fills meanwhile (64 KiB: at most ~3 MiB/s pass before QEMU, and so the
// guest's console, has to wait for us).
type coalescingReader struct {
	r     *os.File
	wait  time.Duration
	short bool
}

func (c *coalescingReader) Read(p []byte) (int, error) {
	if c.short {
		time.Sleep(c.wait)
	}
	n, err := c.r.Read(p)
	c.short = n < len(p)/2
	return n, err
}

// consolePipe is the pipe QEMU's stdout (the guest's ttyS0) goes into.
// Its read end is blocking and so stays out of Go's network poller: QEMU
// writes the console a byte at a time, and every write to a polled
// (edge-triggered) pipe wakes the poller even while the copier sleeps,
// ~30000 wake-ups a second for a flooding guest. The copier's goroutine
// holds a thread in read instead.
func consolePipe() (r, w *os.File, err error) {
	var p [2]int
	// pipe2(O_CLOEXEC), blocking
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(p[0]), "console-r"), os.NewFile(uintptr(p[1]), "console-w"), nil
}
