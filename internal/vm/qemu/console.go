package qemu

import (
	"bufio"
	"io"
	"os"
	"strings"
	"sync"
)

// maxConsoleLine bounds one forwarded console line; longer lines are cut.
const maxConsoleLine = 4096

// consoleKeep is how many of the last console lines ConsoleTail can give.
const consoleKeep = 50

// consoleTail holds the guest console's last lines, for error messages.
type consoleTail struct {
	mu sync.Mutex
	// lines is guarded by mu: a ring of up to consoleKeep lines, next is
	// where the next one goes.
	lines []string
	next  int
}

func (t *consoleTail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) < consoleKeep {
		t.lines = append(t.lines, line)
		return
	}
	t.lines[t.next] = line
	t.next = (t.next + 1) % consoleKeep
}

// last returns up to n of the most recent lines, oldest first.
func (t *consoleTail) last(n int) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ordered := append(append([]string(nil), t.lines[t.next:]...), t.lines[:t.next]...)
	if len(ordered) > n {
		ordered = ordered[len(ordered)-n:]
	}
	return ordered
}

// ConsoleTail returns up to n (at most 50) of the guest console's last
// lines, oldest first: what a caller adds to an error when the guest
// failed. Once Done is closed it holds everything the guest wrote.
func (q *QEMU) ConsoleTail(n int) []string { return q.tail.last(n) }

// copyConsole copies QEMU's stdout (the guest's ttyS0) into the console
// log (size-capped with rotation, consolelog.go) and hands each line to
// ConsoleOutput (rate-limited), until QEMU exits. It blocks in read: an
// idle guest costs nothing here.
func (q *QEMU) copyConsole(r *os.File, logFile *rotatingLog) {
	defer close(q.console)
	defer logFile.Close()
	defer r.Close()
	logFile.onErr = func(err error) { q.log.Warn("console log: dropping the guest console from now on", "error", err) }
	out := q.cfg.ConsoleOutput
	lim := newLineLimiter(consoleLinesPerSec, consoleBurst)
	in := &coalescingReader{r: r, wait: consoleCoalesce}
	br := bufio.NewReaderSize(io.TeeReader(in, logFile), maxConsoleLine)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			l := strings.TrimRight(string(line), "\r\n")
			q.tail.add(l)
			if out != nil {
				if lim.allow() {
					out(l)
				}
				if n := lim.report(false); n > 0 {
					out(droppedMessage(n))
				}
			}
		}
		if err == bufio.ErrBufferFull {
			continue // the rest of a long line comes as the next one
		}
		if err != nil {
			if n := lim.report(true); out != nil && n > 0 {
				out(droppedMessage(n))
			}
			return
		}
	}
}
