package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
)

// recordingSys is a pingSys that logs each call, and fails the one named
// by fail.
type recordingSys struct {
	calls   []string
	entropy []byte
	clockNs int64
	stepNs  int64
	fail    string
}

func (r *recordingSys) sys() pingSys {
	step := func(name string) error {
		r.calls = append(r.calls, name)
		if name == r.fail {
			return errors.New("operation not permitted")
		}
		return nil
	}
	return pingSys{
		addEntropy: func(b []byte) error { r.entropy = slices.Clone(b); return step("entropy") },
		reseedCRNG: func() error { return step("reseed") },
		setClock:   func(ns int64) error { r.clockNs = ns; return step("clock") },
		stepClock:  func(ns int64) error { r.stepNs = ns; return step("step") },
		now:        func() int64 { return 1_700_000_000_999_000_000 },
		readBootID: func() ([]byte, error) { return []byte("boot-1\n"), step("boot id") },
	}
}

func TestPingTakesHostStateBeforeBootID(t *testing.T) {
	rec := &recordingSys{}
	s := &Service{sys: rec.sys()}
	entropy := []byte{1, 2, 3, 4}
	resp, err := s.Ping(context.Background(), &agentapi.PingRequest{Entropy: entropy, HostTimeUnixNs: 1_700_000_000_123_456_789})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"entropy", "reseed", "clock", "boot id"}; !slices.Equal(rec.calls, want) {
		t.Errorf("calls %q, want %q", rec.calls, want)
	}
	if !bytes.Equal(rec.entropy, entropy) {
		t.Errorf("entropy % x, want % x", rec.entropy, entropy)
	}
	if rec.clockNs != 1_700_000_000_123_456_789 {
		t.Errorf("clock set to %d", rec.clockNs)
	}
	if resp.BootId != "boot-1" {
		t.Errorf("boot id %q", resp.BootId)
	}
	if resp.TimeUnixNs != 1_700_000_000_999_000_000 {
		t.Errorf("time %d, want the guest clock's after the step", resp.TimeUnixNs)
	}
}

// The host's correction moves the clock by its step, relative to where
// the clock stands (clock_adjtime), not to a time.
func TestPingStepsTheClockByTheCorrection(t *testing.T) {
	rec := &recordingSys{}
	s := &Service{sys: rec.sys()}
	if _, err := s.Ping(context.Background(), &agentapi.PingRequest{ClockStepNs: 150_000_000}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"step", "boot id"}; !slices.Equal(rec.calls, want) {
		t.Errorf("calls %q, want %q", rec.calls, want)
	}
	if rec.stepNs != 150_000_000 || rec.clockNs != 0 {
		t.Errorf("stepped by %d, set to %d; want a step of 150ms only", rec.stepNs, rec.clockNs)
	}
	rec = &recordingSys{fail: "step"}
	s = &Service{sys: rec.sys()}
	_, err := s.Ping(context.Background(), &agentapi.PingRequest{ClockStepNs: -7})
	if st, _ := status.FromError(err); st.Code() != codes.Internal || st.Message() != "stepping the clock by -7 ns: operation not permitted" {
		t.Errorf("failing step: %v", err)
	}
}

// The timex of a relative step: nanoseconds in the usec field, never
// negative.
func TestSetOffset(t *testing.T) {
	for _, tc := range []struct {
		delta   int64
		sec, ns int64
	}{
		{150_000_000, 0, 150_000_000},
		{-1_500_000_000, -2, 500_000_000},
		{-3_000_000_000, -3, 0},
		{2_000_000_001, 2, 1},
		{-1, -1, 999_999_999},
	} {
		tx := setOffset(tc.delta)
		if tx.Modes != unix.ADJ_SETOFFSET|unix.ADJ_NANO || tx.Time.Sec != tc.sec || tx.Time.Usec != tc.ns {
			t.Errorf("%d ns: modes %#x, time {%d s, %d ns}, want {%d s, %d ns}", tc.delta, tx.Modes, tx.Time.Sec, tx.Time.Usec, tc.sec, tc.ns)
		}
	}
}

// A Ping without entropy or time is the plain readiness probe it was.
func TestPingWithoutHostStateChangesNothing(t *testing.T) {
	rec := &recordingSys{}
	s := &Service{sys: rec.sys()}
	if _, err := s.Ping(context.Background(), &agentapi.PingRequest{}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"boot id"}; !slices.Equal(rec.calls, want) {
		t.Errorf("calls %q, want %q", rec.calls, want)
	}
}

// Each of the steps is independent of the other: time alone sets only the
// clock, entropy alone only reseeds.
func TestPingStepsAreIndependent(t *testing.T) {
	for _, tc := range []struct {
		req  *agentapi.PingRequest
		want []string
	}{
		{&agentapi.PingRequest{HostTimeUnixNs: 1}, []string{"clock", "boot id"}},
		{&agentapi.PingRequest{Entropy: []byte{9}}, []string{"entropy", "reseed", "boot id"}},
	} {
		rec := &recordingSys{}
		s := &Service{sys: rec.sys()}
		if _, err := s.Ping(context.Background(), tc.req); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(rec.calls, tc.want) {
			t.Errorf("%v: calls %q, want %q", tc.req, rec.calls, tc.want)
		}
	}
}

func TestPingStepFailures(t *testing.T) {
	for _, tc := range []struct {
		fail, msg string
		calls     []string
	}{
		{"entropy", "adding host entropy: operation not permitted", []string{"entropy"}},
		{"reseed", "reseeding the CRNG: operation not permitted", []string{"entropy", "reseed"}},
		{"clock", "setting the clock: operation not permitted", []string{"entropy", "reseed", "clock"}},
	} {
		rec := &recordingSys{fail: tc.fail}
		s := &Service{sys: rec.sys()}
		_, err := s.Ping(context.Background(), &agentapi.PingRequest{Entropy: []byte{1}, HostTimeUnixNs: 1})
		st, _ := status.FromError(err)
		if st.Code() != codes.Internal || st.Message() != tc.msg {
			t.Errorf("%s failing: got %v, want Internal %q", tc.fail, err, tc.msg)
		}
		if !slices.Equal(rec.calls, tc.calls) {
			t.Errorf("%s failing: calls %q, want %q", tc.fail, rec.calls, tc.calls)
		}
	}
}

func TestPingRejectsInvalidRequests(t *testing.T) {
	for _, tc := range []struct {
		req  *agentapi.PingRequest
		want string
	}{
		{&agentapi.PingRequest{Entropy: make([]byte, maxPingEntropy+1)}, "4097 bytes"},
		{&agentapi.PingRequest{HostTimeUnixNs: -5}, "-5"},
		{&agentapi.PingRequest{HostTimeUnixNs: 1, ClockStepNs: 2}, "host time 1 ns and clock step 2 ns in one request"},
	} {
		rec := &recordingSys{}
		s := &Service{sys: rec.sys()}
		_, err := s.Ping(context.Background(), tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want InvalidArgument mentioning %s", err, tc.want)
		}
		if len(rec.calls) != 0 {
			t.Errorf("made calls %q for an invalid request", rec.calls)
		}
	}
	// The limit itself is allowed.
	rec := &recordingSys{}
	s := &Service{sys: rec.sys()}
	if _, err := s.Ping(context.Background(), &agentapi.PingRequest{Entropy: make([]byte, maxPingEntropy)}); err != nil {
		t.Errorf("entropy of %d bytes: %v", maxPingEntropy, err)
	}
}

// The rand_pool_info RNDADDENTROPY reads: entropy_count in bits, buf_size
// in bytes, both C ints in the machine's byte order, then the bytes.
func TestRandPoolInfo(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the expected bytes below are little-endian")
	}
	got := randPoolInfo([]byte{0xaa, 0xbb, 0xcc})
	want := []byte{
		24, 0, 0, 0, // entropy_count: 3*8 bits
		3, 0, 0, 0, // buf_size
		0xaa, 0xbb, 0xcc,
	}
	if !bytes.Equal(got, want) {
		t.Errorf("3 bytes: got % x, want % x", got, want)
	}

	b := make([]byte, 300)
	b[0], b[299] = 0x11, 0x22
	got = randPoolInfo(b)
	head := []byte{
		0x60, 0x09, 0, 0, // 2400 bits
		0x2c, 0x01, 0, 0, // 300 bytes
	}
	if len(got) != 308 || !bytes.Equal(got[:8], head) || got[8] != 0x11 || got[307] != 0x22 {
		t.Errorf("300 bytes: got %d bytes, header % x, first %#x, last %#x", len(got), got[:8], got[8], got[len(got)-1])
	}
}
