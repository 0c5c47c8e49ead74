package agent

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
)

// A forwarded connection carries bytes both ways, passes the host's
// half-close on, reports the guest side's EOF, and is forgotten at close.
func TestPortForwardRelay(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// Read everything up to the peer's half-close, answer in upper case.
		var b strings.Builder
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			b.WriteString(sc.Text())
		}
		c.Write([]byte(strings.ToUpper(b.String())))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := &Service{}
	port := uint32(ln.Addr().(*net.TCPAddr).Port)
	open, err := s.OpenPort(ctx, &agentapi.OpenPortRequest{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WritePort(ctx, &agentapi.WritePortRequest{Id: open.Id, Data: []byte("hello\n")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClosePort(ctx, &agentapi.ClosePortRequest{Id: open.Id, WriteOnly: true}); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for {
		r, err := s.ReadPort(ctx, &agentapi.ReadPortRequest{Id: open.Id})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.Data...)
		if r.Eof {
			break
		}
	}
	if string(got) != "HELLO" {
		t.Errorf("read %q, want HELLO", got)
	}
	if _, err := s.ClosePort(ctx, &agentapi.ClosePortRequest{Id: open.Id}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadPort(ctx, &agentapi.ReadPortRequest{Id: open.Id}); status.Code(err) != codes.NotFound {
		t.Errorf("read after close: %v, want NotFound", err)
	}
}

func TestPortForwardNothingListens(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint32(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	s := &Service{}
	_, err = s.OpenPort(context.Background(), &agentapi.OpenPortRequest{Port: port})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "127.0.0.1:") {
		t.Errorf("open of a closed port: %v, want FailedPrecondition naming the address", err)
	}
	if _, err := s.OpenPort(context.Background(), &agentapi.OpenPortRequest{Port: 70000}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("open of port 70000: %v, want InvalidArgument", err)
	}
}
