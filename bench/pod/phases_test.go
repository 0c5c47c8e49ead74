package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// logLines writes containerd log lines at base+ms.
type logLines struct {
	base time.Time
	b    strings.Builder
}

func (l *logLines) add(ms int, msg string, fields ...string) {
	t := l.base.Add(time.Duration(ms) * time.Millisecond).Format(time.RFC3339Nano)
	fmt.Fprintf(&l.b, "time=%q level=info msg=%q %s\n", t, msg, strings.Join(fields, " "))
}

func id(c byte) string { return strings.Repeat(string(c), 64) }

// pod writes one bench pod's start: RunPodSandbox at at, each event
// 10 ms after the one before (the restore only when restored).
func (l *logLines) pod(at int, name string, sb, ct byte, restored bool) {
	s, c := id(sb), id(ct)
	meta := "&PodSandboxMetadata{Name:" + name + ",Uid:" + name + "-uid,Namespace:hull-e2e,Attempt:0,}"
	l.add(at, "RunPodSandbox for "+meta)
	l.add(at+10, "booting the pod's VM", "sandbox="+s)
	l.add(at+20, "qmp ready", "elapsed=10ms", "sandbox="+s)
	next := at + 30
	if restored {
		l.add(next, "vm restored", "sandbox="+s)
		next += 10
	}
	l.add(next, "sandbox VM ready", "sandbox="+s)
	l.add(next+10, "guest console", `line="msg=\"container created\""`, "sandbox="+s)
	l.add(next+10, "container created", "container="+s, "sandbox="+s)
	l.add(next+20, "RunPodSandbox for "+meta+` returns sandbox id "`+s+`"`)
	l.add(next+30, `CreateContainer within sandbox "`+s+`" for &ContainerMetadata{Name:c,Attempt:0,} returns container id "`+c+`"`)
	l.add(next+40, `StartContainer for "`+c+`"`)
	l.add(next+50, "container created", "container="+c, "sandbox="+s)
	l.add(next+60, `StartContainer for "`+c+`" returns successfully`)
}

func TestPhases(t *testing.T) {
	l := &logLines{base: time.Date(2026, 12, 4, 17, 0, 0, 0, time.UTC)}
	l.pod(0, "bench-hull-0", 'a', 'b', false) // builds the template: left out
	l.pod(1000, "bench-hull-1", 'c', 'd', true)
	l.pod(2000, "bench-hull-cold-1", 'e', 'f', false)
	l.add(3000, "RunPodSandbox for &PodSandboxMetadata{Name:bench-runc-1,Uid:u,Namespace:hull-e2e,Attempt:0,}")
	pods, err := readPhases(strings.NewReader(l.b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 4 {
		t.Fatalf("%d pods read, want 4", len(pods))
	}
	table := phaseTable(pods)
	if len(table) != 2 || table["hull"] == nil || table["hull-cold"] == nil {
		t.Fatalf("handlers %v, want hull and hull-cold", table)
	}
	ms := func(h, phase string) []time.Duration { return table[h][phase] }
	want := map[string]map[string]time.Duration{
		"hull": {"→ VM restored": 10 * time.Millisecond, "whole": 100 * time.Millisecond,
			"→ sandbox VM ready (restored: first Ping, clock, network; cold: the boot)": 10 * time.Millisecond},
		"hull-cold": {"whole": 90 * time.Millisecond,
			"→ sandbox VM ready (restored: first Ping, clock, network; cold: the boot)": 10 * time.Millisecond},
	}
	for h, phases := range want {
		for ph, d := range phases {
			if got := ms(h, ph); len(got) != 1 || got[0] != d {
				t.Errorf("%s %q: %v, want [%v]", h, ph, got, d)
			}
		}
	}
	if got := ms("hull-cold", "→ VM restored"); got != nil {
		t.Errorf("a cold boot has a restore: %v", got)
	}
	for _, ph := range phases {
		if ph.name != "→ VM restored" && len(ms("hull", ph.name)) != 1 {
			t.Errorf("hull %q: %v, want one value", ph.name, ms("hull", ph.name))
		}
	}
	var out bytes.Buffer
	printPhases(&out, table)
	if !strings.Contains(out.String(), "where hull's pod start went") || !strings.Contains(out.String(), "    100 (100)") {
		t.Errorf("printed:\n%s", out.String())
	}
}

// A shim line of another sandbox while RunPodSandbox is in progress does
// not end up in that pod's row: the id RunPodSandbox returns must be the
// one its shim booted.
func TestPhasesDropAPodWithAnothersLines(t *testing.T) {
	l := &logLines{base: time.Date(2026, 12, 4, 17, 0, 0, 0, time.UTC)}
	meta := "&PodSandboxMetadata{Name:bench-hull-1,Uid:u,Namespace:hull-e2e,Attempt:0,}"
	l.add(0, "RunPodSandbox for "+meta)
	l.add(10, "booting the pod's VM", "sandbox="+id('1'))
	l.add(20, "RunPodSandbox for "+meta+` returns sandbox id "`+id('2')+`"`)
	pods, err := readPhases(strings.NewReader(l.b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 || pods[0].at != nil {
		t.Fatalf("pods %+v: want one, dropped", pods)
	}
}
