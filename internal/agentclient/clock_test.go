package agentclient

import (
	"context"
	"errors"
	"testing"
	"time"

	agent "github.com/hull-runtime/hull/api/agent/v1"
)

// fakeGuest is a guest whose clock is off the host's by offset; each Ping
// takes the next of trips (to the guest, back) on a host clock that only
// the trips move.
type fakeGuest struct {
	host   time.Time
	offset time.Duration
	trips  [][2]time.Duration
	steps  []int64
	fail   error
}

func (g *fakeGuest) now() time.Time { return g.host }

func (g *fakeGuest) Ping(_ context.Context, r *agent.PingRequest) (*agent.PingResponse, error) {
	if g.fail != nil {
		return nil, g.fail
	}
	trip := [2]time.Duration{time.Millisecond, time.Millisecond}
	if len(g.trips) > 0 {
		trip, g.trips = g.trips[0], g.trips[1:]
	}
	g.host = g.host.Add(trip[0])
	if r.ClockStepNs != 0 {
		g.steps = append(g.steps, r.ClockStepNs)
		g.offset += time.Duration(r.ClockStepNs)
	}
	guest := g.host.Add(g.offset).UnixNano()
	g.host = g.host.Add(trip[1])
	return &agent.PingResponse{TimeUnixNs: guest}, nil
}

// A guest 150 ms behind (the first Ping's late step) is moved forward by
// the sample with the shortest round trip, to within half of it.
func TestSyncClockStepsByTheBestSample(t *testing.T) {
	g := &fakeGuest{host: time.Unix(1_700_000_000, 0), offset: -150 * time.Millisecond,
		trips: [][2]time.Duration{{40 * time.Millisecond, 2 * time.Millisecond}, {3 * time.Millisecond, 3 * time.Millisecond}, {9 * time.Millisecond, time.Millisecond}}}
	s, err := syncClock(context.Background(), g, g.now)
	if err != nil {
		t.Fatal(err)
	}
	if s.RTT != 6*time.Millisecond || s.Offset != -150*time.Millisecond {
		t.Errorf("sample %+v, want the 6 ms round trip measuring -150ms", s)
	}
	if len(g.steps) != 1 || g.steps[0] != (150*time.Millisecond).Nanoseconds() {
		t.Fatalf("steps %v, want one of +150ms", g.steps)
	}
	if g.offset != 0 {
		t.Errorf("guest left %v off", g.offset)
	}
}

// An asymmetric trip biases the midpoint by half the asymmetry, never more
// than half the round trip; the step leaves the guest within that.
func TestSyncClockErrorIsWithinHalfTheRoundTrip(t *testing.T) {
	g := &fakeGuest{host: time.Unix(1_700_000_000, 0), offset: 80 * time.Millisecond,
		trips: [][2]time.Duration{{9 * time.Millisecond, time.Millisecond}, {9 * time.Millisecond, time.Millisecond}, {9 * time.Millisecond, time.Millisecond}}}
	s, err := syncClock(context.Background(), g, g.now)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.steps) != 1 {
		t.Fatalf("steps %v, want one", g.steps)
	}
	if g.offset.Abs() > s.RTT/2 {
		t.Errorf("guest left %v off after a %v round trip", g.offset, s.RTT)
	}
}

// A guest within what the measure can tell is left alone, and a fast
// round trip ends the probing.
func TestSyncClockLeavesAnAccurateGuest(t *testing.T) {
	g := &fakeGuest{host: time.Unix(1_700_000_000, 0), offset: 200 * time.Microsecond,
		trips: [][2]time.Duration{{300 * time.Microsecond, 300 * time.Microsecond}, {time.Second, time.Second}}}
	s, err := syncClock(context.Background(), g, g.now)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.steps) != 0 {
		t.Errorf("steps %v for a guest %v off, measured ±%v", g.steps, s.Offset, s.RTT/2)
	}
	if len(g.trips) != 1 {
		t.Errorf("%d probes after a %v round trip, want 1", 2-len(g.trips), s.RTT)
	}
}

// An agent that reports no time (an older one) or a failed Ping is an
// error naming the clock.
func TestSyncClockErrors(t *testing.T) {
	old := pingerFunc(func(context.Context, *agent.PingRequest) (*agent.PingResponse, error) {
		return &agent.PingResponse{AgentVersion: "0.1"}, nil
	})
	if _, err := syncClock(context.Background(), old, time.Now); err == nil || err.Error() != `measuring the guest's clock: the agent (version "0.1") reports no time` {
		t.Errorf("old agent: %v", err)
	}
	boom := errors.New("connection reset")
	g := &fakeGuest{fail: boom}
	if _, err := syncClock(context.Background(), g, time.Now); !errors.Is(err, boom) {
		t.Errorf("failed ping: %v", err)
	}
}

type pingerFunc func(context.Context, *agent.PingRequest) (*agent.PingResponse, error)

func (f pingerFunc) Ping(ctx context.Context, r *agent.PingRequest) (*agent.PingResponse, error) {
	return f(ctx, r)
}
