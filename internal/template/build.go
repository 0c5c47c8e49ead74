package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu"
)

const (
	// buildTimeout bounds a template's boot up to its agent.
	buildTimeout = 60 * time.Second
	// settle lets the agent, once it has opened its port, reach the read
	// that waits for the host, so that clones resume there.
	settle = 150 * time.Millisecond
)

// buildVM boots the template's guest in dir with its RAM in dir/memory,
// waits until the agent has opened its channel (QEMU's VSERPORT_CHANGE
// event: no host connects, so nothing in the guest has read its boot id
// or served a request), saves the device state to dir/state and stops
// QEMU. It records the state's digest in m.
func buildVM(ctx context.Context, dir, key string, m *Meta, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	sh := m.Shape
	empty := filepath.Join(dir, emptyName)
	if err := os.Mkdir(empty, 0o700); err != nil {
		return err
	}
	// QEMU sizes the file; made here so that only root can read it.
	mem, err := os.OpenFile(filepath.Join(dir, memoryName), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	mem.Close()
	cfg := vm.Config{
		ID: "template-" + key[:12], Dir: dir,
		Binary: sh.QEMU, MachineType: sh.MachineType, Firmware: sh.Firmware,
		VCPUs: sh.VCPUs, MemoryMiB: sh.MemoryMiB,
		Kernel: sh.Kernel, Initrd: sh.Initrd, KernelParams: sh.KernelParams, Accel: sh.Accel,
		Memory: &vm.MemoryFile{Path: filepath.Join(dir, memoryName), Shared: true},
		ConsoleOutput: func(line string) {
			log.Debug("template guest console", "template", key, "line", line)
		},
	}
	for _, tag := range sh.ShareTags {
		cfg.Shares = append(cfg.Shares, vm.Share{Tag: tag, HostPath: empty, ReadOnly: true})
	}
	for i := range sh.NICs {
		cfg.NICs = append(cfg.NICs, vm.NIC{ID: "net" + strconv.Itoa(i), MAC: PlaceholderMAC(i)})
	}
	q, err := qemu.New(cfg, log)
	if err != nil {
		return err
	}
	if err := q.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer scancel()
		q.Stop(sctx, time.Second)
	}()
	if err := waitAgentPort(ctx, q); err != nil {
		return vm.WithConsole(err, q.ConsoleTail(20))
	}
	time.Sleep(settle)

	f, err := os.OpenFile(filepath.Join(dir, stateName), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := q.SaveState(ctx, f); err != nil {
		return err
	}
	if m.StateSHA256, err = digest(f); err != nil {
		return fmt.Errorf("reading the saved state: %w", err)
	}
	return f.Sync()
}

// waitAgentPort waits until the guest has opened its agent port, QEMU
// exits, or ctx ends.
func waitAgentPort(ctx context.Context, q *qemu.QEMU) error {
	w := q.QMP().Watch(qemu.AgentPortEvent(true))
	defer w.Stop()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-q.Done():
			cancel()
		case <-wctx.Done():
		}
	}()
	_, err := w.Wait(wctx)
	if err == nil {
		return nil
	}
	// QMP's end may be seen before QEMU is reaped: give it a moment.
	select {
	case <-q.Done():
		return errors.New("the template's guest stopped before its agent was ready")
	case <-time.After(time.Second):
	}
	return fmt.Errorf("waiting for the template's agent: %w", err)
}

// writeMeta writes dir/meta.json, the last file of a build.
func writeMeta(dir string, m Meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, metaName), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
