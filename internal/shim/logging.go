package shim

import (
	"context"
	"log/slog"

	"github.com/containerd/log"
)

// logHandler makes the sandbox's slog lines (internal/sandbox, the QEMU
// driver, the network and device code) go through the shim's one log
// stack: containerd's logger, which the shim package points at
// containerd's log and whose level follows containerd's -debug flag.
// Hull's own debug switch (enable_debug in the configuration) lowers the
// level further for its lines, never raises it.
type logHandler struct {
	entry *log.Entry
	debug bool // Hull's configuration asks for debug lines
}

var _ slog.Handler = (*logHandler)(nil)

func newLogHandler(entry *log.Entry, debug bool) *logHandler {
	return &logHandler{entry: entry, debug: debug}
}

func (h *logHandler) Enabled(_ context.Context, l slog.Level) bool {
	if l < slog.LevelInfo {
		return h.debug || log.GetLevel() >= log.DebugLevel
	}
	return true
}

func (h *logHandler) Handle(_ context.Context, r slog.Record) error {
	e := h.entry
	r.Attrs(func(a slog.Attr) bool {
		e = e.WithField(a.Key, a.Value.Any())
		return true
	})
	switch {
	case r.Level >= slog.LevelError:
		e.Error(r.Message)
	case r.Level >= slog.LevelWarn:
		e.Warn(r.Message)
	case r.Level >= slog.LevelInfo:
		e.Info(r.Message)
	case h.debug && log.GetLevel() < log.DebugLevel:
		// Asked for by Hull's configuration only: logged at info,
		// which containerd's level lets through.
		e.WithField("level_hull", "debug").Info(r.Message)
	default:
		e.Debug(r.Message)
	}
	return nil
}

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	e := h.entry
	for _, a := range attrs {
		e = e.WithField(a.Key, a.Value.Any())
	}
	return &logHandler{entry: e, debug: h.debug}
}

// WithGroup is not used by Hull's code; groups are flattened.
func (h *logHandler) WithGroup(string) slog.Handler { return h }
