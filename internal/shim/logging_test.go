package shim

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
)

// The sandbox's slog lines go through containerd's logger, with its
// fields, at containerd's level; Hull's enable_debug adds debug lines.
func TestLogHandlerFollowsContainerdLevel(t *testing.T) {
	var buf bytes.Buffer
	l := logrus.New()
	l.Out = &buf
	l.Formatter = &logrus.TextFormatter{DisableTimestamp: true}
	entry := logrus.NewEntry(l).WithField("sandbox", "pod1")
	old := log.GetLevel()
	defer log.SetLevel(old.String())

	for _, tc := range []struct {
		containerdDebug, hullDebug, wantDebug bool
	}{
		{false, false, false},
		{true, false, true},
		{false, true, true},
	} {
		buf.Reset()
		lvl := "info"
		if tc.containerdDebug {
			lvl = "debug"
		}
		if err := log.SetLevel(lvl); err != nil {
			t.Fatal(err)
		}
		l.SetLevel(logrus.GetLevel())
		lg := slog.New(newLogHandler(entry, tc.hullDebug)).With("container", "c1")
		lg.Debug("qemu args", "n", 3)
		lg.Warn("tap gone")
		out := buf.String()
		if !strings.Contains(out, `msg="tap gone"`) || !strings.Contains(out, "sandbox=pod1") || !strings.Contains(out, "container=c1") {
			t.Errorf("%+v: warning line missing or without fields:\n%s", tc, out)
		}
		if got := strings.Contains(out, "qemu args"); got != tc.wantDebug {
			t.Errorf("%+v: debug line present = %v:\n%s", tc, got, out)
		}
	}
}
