package stdio

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"
)

func readAll(t *testing.T, s *Stream, max int) []byte {
	t.Helper()
	var out []byte
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		data, eof, err := s.Read(ctx, max)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if max > 0 && len(data) > max {
			t.Fatalf("read %d bytes, max %d", len(data), max)
		}
		out = append(out, data...)
		if eof {
			return out
		}
	}
}

func TestStreamOrderAndEOF(t *testing.T) {
	r, w := io.Pipe()
	s := NewStream(r)
	want := bytes.Repeat([]byte("0123456789abcdef"), 100000) // 1.6 MB
	go func() {
		for i := 0; i < len(want); i += 1000 {
			w.Write(want[i:min(i+1000, len(want))])
		}
		w.Close()
	}()
	got := readAll(t, s, 7000)
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d (order or content differs)", len(got), len(want))
	}
	// After EOF every read returns EOF at once.
	data, eof, err := s.Read(context.Background(), 10)
	if len(data) != 0 || !eof || err != nil {
		t.Fatalf("read after eof: %q %v %v", data, eof, err)
	}
}

func TestStreamDataSurvivesWriterClose(t *testing.T) {
	r, w := io.Pipe()
	s := NewStream(r)
	go func() { w.Write([]byte("out\n")); w.Close() }()
	time.Sleep(50 * time.Millisecond)
	if got := readAll(t, s, 0); string(got) != "out\n" {
		t.Fatalf("got %q", got)
	}
}

func TestStreamReadBlocksUntilData(t *testing.T) {
	r, w := io.Pipe()
	s := NewStream(r)
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := s.Read(ctx, 0); err != context.DeadlineExceeded {
		t.Fatalf("read on empty stream: %v, want deadline", err)
	}
	go w.Write([]byte("x"))
	data, eof, err := s.Read(context.Background(), 0)
	if string(data) != "x" || eof || err != nil {
		t.Fatalf("got %q %v %v", data, eof, err)
	}
}

func TestClosedStream(t *testing.T) {
	data, eof, err := Closed().Read(context.Background(), 0)
	if len(data) != 0 || !eof || err != nil {
		t.Fatalf("got %q %v %v", data, eof, err)
	}
}
