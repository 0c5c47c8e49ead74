package qemu

import (
	"bufio"
	"io"
	"os"
	"strings"
)

// maxConsoleLine bounds one forwarded console line; longer lines are cut.
const maxConsoleLine = 4096

// copyConsole copies QEMU's stdout (the guest's ttyS0) into the console
// log file and hands each line to ConsoleOutput, until QEMU exits. It
// blocks in read: an idle guest costs nothing here.
func (q *QEMU) copyConsole(r *os.File, logFile *os.File) {
	defer close(q.console)
	defer logFile.Close()
	defer r.Close()
	out := q.cfg.ConsoleOutput
	br := bufio.NewReaderSize(io.TeeReader(r, logFile), maxConsoleLine)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 && out != nil {
			out(strings.TrimRight(string(line), "\r\n"))
		}
		if err == bufio.ErrBufferFull {
			continue // the rest of a long line comes as the next one
		}
		if err != nil {
			return
		}
	}
}
