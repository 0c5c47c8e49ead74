package qemu

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/vm"
)

func TestConsoleTailKeepsTheLastLinesInOrder(t *testing.T) {
	var c consoleTail
	for i := 0; i < 3; i++ {
		c.add(fmt.Sprint(i))
	}
	if got := c.last(5); !reflect.DeepEqual(got, []string{"0", "1", "2"}) {
		t.Fatalf("last(5) = %v", got)
	}
	for i := 3; i < consoleKeep+7; i++ {
		c.add(fmt.Sprint(i))
	}
	want := []string{fmt.Sprint(consoleKeep + 4), fmt.Sprint(consoleKeep + 5), fmt.Sprint(consoleKeep + 6)}
	if got := c.last(3); !reflect.DeepEqual(got, want) {
		t.Fatalf("last(3) = %v, want %v", got, want)
	}
	if got := c.last(1000); len(got) != consoleKeep || got[0] != "7" {
		t.Fatalf("last(1000) = %d lines from %q", len(got), got[0])
	}
}

func TestRotatingLogKeepsTwoBoundedFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	w, err := openRotatingLog(path, 10000)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("x"), 999)
	var last []byte
	for i := range 1000 { // ~1 MB through a 10 kB cap
		last = append(chunk[:998:998], byte('0'+i%10))
		if n, err := w.Write(last); n != len(last) || err != nil {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
	}
	w.Close()
	cur, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(path + rotatedSuffix)
	if err != nil {
		t.Fatal(err)
	}
	if len(cur) > 10000 || len(old) > 10000 || len(old) < 9000 {
		t.Errorf("sizes: %s %d, %s %d; want each <= 10000, the rotated one full", path, len(cur), path+rotatedSuffix, len(old))
	}
	if !bytes.HasSuffix(cur, last) {
		t.Errorf("the current log does not end with the last write")
	}
	// A single write larger than the cap keeps its end.
	w, _ = openRotatingLog(path, 100)
	w.Write(bytes.Repeat([]byte("ab"), 100))
	w.Close()
	if b, _ := os.ReadFile(path); len(b) != 100 {
		t.Errorf("oversized write left %d bytes, want 100", len(b))
	}
}

func TestLineLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newLineLimiter(10, 5)
	l.now = func() time.Time { return now }
	allowed, reports, reported := 0, 0, 0
	step := func(n int) {
		for range n {
			if l.allow() {
				allowed++
			}
			if d := l.report(false); d > 0 {
				reports++
				reported += d
			}
		}
	}
	step(100)
	if allowed != 5 || reports != 1 || reported != 1 {
		t.Fatalf("burst: %d allowed, %d reports of %d; want 5 allowed, the first drop reported at once", allowed, reports, reported)
	}
	now = now.Add(time.Second) // 10 more tokens, capped at the burst
	step(100)
	if allowed != 10 {
		t.Errorf("after 1 s: %d lines allowed in all, want 10 (the burst caps the refill)", allowed)
	}
	if reports != 2 || reported != 1+94 {
		t.Errorf("after 1 s: %d reports of %d dropped lines; want 2 reports of 95 (the first drop at once, the rest of the first second 1 s later)", reports, reported)
	}
	if d := l.report(true); d != 95 || allowed+reported+d != 200 {
		t.Errorf("final report: %d; allowed %d + reported %d + final = %d, want 200", d, allowed, reported, allowed+reported+d)
	}
}

// A guest flooding its console: the forwarded lines are rate-limited,
// the drop is reported with its count, the log files stay bounded and
// the tail still has the very last line.
func TestCopyConsoleFloodIsBounded(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var forwarded []string
	q := &QEMU{cfg: vm.Config{Dir: dir, ConsoleOutput: func(l string) {
		mu.Lock()
		forwarded = append(forwarded, l)
		mu.Unlock()
	}}, log: slog.New(slog.DiscardHandler), console: make(chan struct{})}
	logf, err := openRotatingLog(q.ConsoleLog(), ConsoleLogMax)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	go q.copyConsole(r, logf)
	const lines = 200000 // ~12 MiB
	line := strings.Repeat("y", 60)
	start := time.Now()
	bw := bufio.NewWriter(w)
	for i := range lines {
		fmt.Fprintf(bw, "%s %d\n", line, i)
	}
	bw.Flush()
	w.Close()
	<-q.console
	elapsed := time.Since(start)

	maxFwd := consoleBurst + int(elapsed.Seconds()*consoleLinesPerSec) + 1
	got, guestLines, reports := 0, 0, 0
	for _, l := range forwarded {
		var n int
		if _, err := fmt.Sscanf(l, "[hull: %d guest console lines not forwarded", &n); err == nil {
			got += n
			reports++
		} else {
			got++
			guestLines++
		}
	}
	if maxReports := int(elapsed/dropReportEvery) + 2; reports > maxReports {
		t.Errorf("%d drop reports in %v, want at most %d", reports, elapsed, maxReports)
	}
	if guestLines > maxFwd {
		t.Errorf("%d guest lines forwarded in %v, want at most %d", guestLines, elapsed, maxFwd)
	}
	if got != lines {
		t.Errorf("forwarded + reported dropped = %d, want %d", got, lines)
	}
	for _, p := range []string{q.ConsoleLog(), q.ConsoleLogRotated()} {
		fi, err := os.Stat(p)
		if err != nil || fi.Size() > ConsoleLogMax {
			t.Errorf("%s: %v, size > %d", p, err, ConsoleLogMax)
		}
	}
	if tail := q.ConsoleTail(1); len(tail) != 1 || tail[0] != fmt.Sprintf("%s %d", line, lines-1) {
		t.Errorf("tail = %q", tail)
	}
	t.Logf("%d lines in %v: %d forwarded", lines, elapsed, len(forwarded))
}
