package agentclient

import (
	"context"
	"fmt"
	"time"

	agent "github.com/hull-runtime/hull/api/agent/v1"
)

// The first Ping steps the guest's clock to the host time the request
// carries, late by the request's trip into the guest: in a clone just
// restored from a template every guest path is translated afresh and the
// trip takes ≈ 0.1–0.2 s under TCG, so its clock ends that much behind.
// syncClock then measures the guest's clock against the host's with empty
// Pings and moves it by the difference (docs/agent-channel.md, "Clock").

// clockProbes is how many empty Pings measure the guest's clock; the one
// with the shortest round trip counts.
const clockProbes = 3

// clockGoodRTT ends the probing early: a round trip this short already
// bounds the error to half of it.
const clockGoodRTT = time.Millisecond

// pinger is the one agent call the clock needs.
type pinger interface {
	Ping(ctx context.Context, r *agent.PingRequest) (*agent.PingResponse, error)
}

// ClockSample is one measure of the guest's clock: Offset is the guest's
// time minus the host's (positive: the guest is ahead), to within ±RTT/2.
type ClockSample struct {
	Offset, RTT time.Duration
}

// MeasureClock sends up to n empty Pings (they change nothing in the
// guest) and returns the sample with the shortest round trip: the guest
// read its clock somewhere between sending and receiving, taken as the
// midpoint (Cristian's algorithm).
func MeasureClock(ctx context.Context, p pinger, n int) (ClockSample, error) {
	return measureClock(ctx, p, n, time.Now)
}

func measureClock(ctx context.Context, p pinger, n int, now func() time.Time) (ClockSample, error) {
	var best ClockSample
	for i := 0; i < n; i++ {
		t0 := now()
		resp, err := p.Ping(ctx, &agent.PingRequest{})
		if err != nil {
			return ClockSample{}, fmt.Errorf("measuring the guest's clock: %w", err)
		}
		t1 := now()
		if resp.TimeUnixNs == 0 {
			return ClockSample{}, fmt.Errorf("measuring the guest's clock: the agent (version %q) reports no time", resp.AgentVersion)
		}
		rtt := t1.Sub(t0)
		mid := t0.Add(rtt / 2)
		s := ClockSample{Offset: time.Unix(0, resp.TimeUnixNs).Sub(mid), RTT: rtt}
		if i == 0 || s.RTT < best.RTT {
			best = s
		}
		if best.RTT <= clockGoodRTT {
			break
		}
	}
	return best, nil
}

// syncClock measures the guest's clock and, when it is off by more than
// the measure can tell (half the round trip), moves it by the offset. It
// returns the offset found before the step.
func syncClock(ctx context.Context, p pinger, now func() time.Time) (ClockSample, error) {
	s, err := measureClock(ctx, p, clockProbes, now)
	if err != nil {
		return s, err
	}
	if s.Offset.Abs() <= s.RTT/2 {
		return s, nil
	}
	if _, err := p.Ping(ctx, &agent.PingRequest{ClockStepNs: -s.Offset.Nanoseconds()}); err != nil {
		return s, fmt.Errorf("correcting the guest's clock by %v: %w", -s.Offset, err)
	}
	return s, nil
}
