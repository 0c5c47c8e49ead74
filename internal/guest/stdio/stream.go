// Package stdio carries a process's standard streams between the agent's
// RPCs and the process: output streams are drained into a bounded buffer by
// one goroutine each, so nothing written before the process exited is lost,
// and read back by long-polling callers.
package stdio

import (
	"context"
	"errors"
	"io"
	"sync"

	"golang.org/x/sys/unix"
)

// MaxRead caps the bytes one Read returns.
const MaxRead = 1 << 20

// bufferLimit is how much unread output a stream holds before it stops
// reading from the process (which then blocks on write, as with a pipe).
const bufferLimit = 4 << 20

// Stream is an output stream of a process.
type Stream struct {
	src io.ReadCloser

	// mu guards buf, eof, err and changed.
	mu  sync.Mutex
	buf []byte
	eof bool
	err error
	// changed is closed and replaced whenever buf or eof change.
	changed chan struct{}
}

// NewStream starts draining src. For a pty master, EIO (all slave ends
// closed) counts as end of stream.
func NewStream(src io.ReadCloser) *Stream {
	s := &Stream{src: src, changed: make(chan struct{})}
	go s.drain()
	return s
}

// Closed returns a stream that is at EOF already (stderr of a tty process).
func Closed() *Stream {
	return &Stream{eof: true, changed: make(chan struct{})}
}

func (s *Stream) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Stream) drain() {
	defer s.src.Close()
	chunk := make([]byte, 32<<10)
	for {
		s.mu.Lock()
		for len(s.buf) >= bufferLimit {
			wait := s.changed
			s.mu.Unlock()
			<-wait
			s.mu.Lock()
		}
		s.mu.Unlock()

		n, err := s.src.Read(chunk)
		s.mu.Lock()
		if n > 0 {
			s.buf = append(s.buf, chunk[:n]...)
		}
		if err != nil {
			s.eof = true
			if !errors.Is(err, io.EOF) && !errors.Is(err, unix.EIO) && !errors.Is(err, io.ErrClosedPipe) {
				s.err = err
			}
		}
		if n > 0 || err != nil {
			s.notifyLocked()
		}
		done := s.eof
		s.mu.Unlock()
		if done {
			return
		}
	}
}

// Read blocks until at least one byte is buffered or the stream ended, and
// returns up to max bytes (max 0 or above MaxRead means MaxRead). eof is true
// once the stream ended and everything was read; data may come with it.
func (s *Stream) Read(ctx context.Context, max int) (data []byte, eof bool, err error) {
	if max <= 0 || max > MaxRead {
		max = MaxRead
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.buf) == 0 && !s.eof {
		wait := s.changed
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			s.mu.Lock()
			return nil, false, ctx.Err()
		}
		s.mu.Lock()
	}
	n := min(max, len(s.buf))
	data = make([]byte, n)
	copy(data, s.buf)
	s.buf = s.buf[n:]
	if len(s.buf) == 0 {
		s.buf = nil // let a large drained buffer go
	}
	s.notifyLocked() // wake the drainer if it waits for room
	return data, s.eof && len(s.buf) == 0, nil
}

// Err returns the read error that ended the stream other than EOF, if any.
func (s *Stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close stops reading the process's output.
func (s *Stream) Close() error {
	if s.src == nil {
		return nil
	}
	return s.src.Close()
}
