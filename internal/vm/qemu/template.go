package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu/qmp"
)

// A VM template (docs/templates.md) is a guest that booted once with its
// RAM in a shared file and was stopped in its agent; its device state is
// saved with QEMU's migration (x-ignore-shared: the RAM stays in the
// file, only devices are written). A clone maps the file privately and
// loads the device state instead of booting.

// statePollInterval is how often SaveState and a restoring Start ask
// QEMU how far they are.
const statePollInterval = 10 * time.Millisecond

// memoryArgs back RAM with cfg.Memory's file and make migration leave
// it out: the clone's RAM is the file itself.
func memoryArgs(cfg vm.Config, size string) []string {
	m := cfg.Memory
	if m == nil {
		return []string{"-object", "memory-backend-ram,id=ram0,size=" + size}
	}
	share := "off"
	if m.Shared {
		share = "on"
	}
	return []string{"-object", "memory-backend-file,id=ram0,size=" + size + ",mem-path=" + esc(m.Path) + ",share=" + share}
}

// ignoreShared makes migration leave out RAM in shared memory (the
// template's file): the saved state holds devices only, and a restore
// expects no RAM. QEMU 7.2 has no command-line switch for it.
func ignoreShared(ctx context.Context, c *qmp.Client) error {
	caps := map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}
	if err := c.Execute(ctx, "migrate-set-capabilities", caps, nil); err != nil {
		return fmt.Errorf("setting migration capability x-ignore-shared: %w", err)
	}
	return nil
}

// restoreArgs make QEMU wait for the command that loads its device
// state (Start sends it once the capability is set).
func restoreArgs(cfg vm.Config) []string {
	if cfg.Restore == nil {
		return nil
	}
	return []string{"-incoming", "defer"}
}

// restoreFD is the descriptor QEMU reads its device state from: Start
// passes it after the NICs' taps.
func restoreFD(cfg vm.Config) int { return NICFirstFD + len(tapFiles(cfg)) }

// tapFiles are the NICs' tap descriptors, in the order QEMU numbers them.
func tapFiles(cfg vm.Config) []*os.File {
	var fs []*os.File
	for _, n := range cfg.NICs {
		if n.TapFile != nil {
			fs = append(fs, n.TapFile)
		}
	}
	return fs
}

// validateMemory checks cfg.Memory and cfg.Restore. A clone's memory file
// must be whole: QEMU would extend a short one, writing to the template.
func validateMemory(cfg vm.Config, bad func(string, ...any)) {
	m := cfg.Memory
	if m.Path == "" || !filepath.IsAbs(m.Path) {
		bad("memory file %q is not an absolute path", m.Path)
		return
	}
	if m.Shared {
		if cfg.Restore != nil {
			bad("memory file %s: a restored VM cannot share its memory file", m.Path)
		}
		if _, err := os.Stat(filepath.Dir(m.Path)); err != nil {
			bad("memory file: %w", err)
		}
		return
	}
	fi, err := os.Stat(m.Path)
	switch {
	case err != nil:
		bad("memory file: %w", err)
	case !fi.Mode().IsRegular():
		bad("memory file %s is not a regular file", m.Path)
	case fi.Size() != int64(cfg.MemoryMiB)<<20:
		bad("memory file %s holds %d bytes, want %d (%d MiB)", m.Path, fi.Size(), int64(cfg.MemoryMiB)<<20, cfg.MemoryMiB)
	}
}

// SaveState pauses the guest and writes its device state to f (a
// template's; the RAM stays in the shared memory file). The VM stays
// paused; the caller stops it.
func (q *QEMU) SaveState(ctx context.Context, f *os.File) error {
	if q.cfg.Memory == nil || !q.cfg.Memory.Shared {
		return errors.New("saving vm state: the vm's memory is not a shared file")
	}
	c := q.QMP()
	if c == nil {
		return errors.New("saving vm state: no QMP connection")
	}
	if err := c.Execute(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("saving vm state: pausing: %w", err)
	}
	if err := ignoreShared(ctx, c); err != nil {
		return fmt.Errorf("saving vm state: %w", err)
	}
	if err := c.SendFD(ctx, int(f.Fd()), "template"); err != nil {
		return fmt.Errorf("saving vm state: passing the state file: %w", err)
	}
	if err := c.Execute(ctx, "migrate", map[string]any{"uri": "fd:template"}, nil); err != nil {
		return fmt.Errorf("saving vm state: %w", err)
	}
	for {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := c.Execute(ctx, "query-migrate", nil, &st); err != nil {
			return fmt.Errorf("saving vm state: %w", err)
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("saving vm state: migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("saving vm state: %w", ctx.Err())
		case <-time.After(statePollInterval):
		}
	}
}

// waitRestored waits until a restoring QEMU has loaded its state and
// runs the guest. A state QEMU cannot load makes it exit: its own
// message is the error.
func (q *QEMU) waitRestored(ctx context.Context) error {
	c := q.QMP()
	if err := ignoreShared(ctx, c); err != nil {
		return fmt.Errorf("restoring vm state: %w", err)
	}
	uri := "fd:" + strconv.Itoa(restoreFD(q.cfg))
	if err := c.Execute(ctx, "migrate-incoming", map[string]any{"uri": uri}, nil); err != nil {
		return fmt.Errorf("restoring vm state: %w", err)
	}
	for {
		var st struct {
			Status string `json:"status"`
		}
		err := c.Execute(ctx, "query-status", nil, &st)
		if err == nil && st.Status == "running" {
			return nil
		}
		if err == nil && st.Status == "paused" {
			// The template was saved paused, and its state says so.
			if err := c.Execute(ctx, "cont", nil, nil); err != nil {
				return fmt.Errorf("restoring vm state: resuming: %w", err)
			}
			continue
		}
		if err == nil && st.Status != "inmigrate" {
			return fmt.Errorf("restoring vm state: the vm is %s after loading it", st.Status)
		}
		select {
		case <-q.done:
			return fmt.Errorf("restoring vm state: %w", q.exitedDuringStart())
		case <-ctx.Done():
			return fmt.Errorf("restoring vm state: %w", ctx.Err())
		case <-time.After(statePollInterval):
		}
	}
}
