package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/state"
)

// testBoot boots sandbox "sb" in a fresh store with a fake QEMU (a
// script) and failpoints fps. It returns the store and the error.
func testBoot(t *testing.T, qemuScript string, fps failpoint.Set) (*state.Store, error) {
	t.Helper()
	return testBootIn(t, t.TempDir(), qemuScript, fps)
}

// testBootIn is testBoot in dir: the store is dir/run.
func testBootIn(t *testing.T, dir, qemuScript string, fps failpoint.Set) (*state.Store, error) {
	t.Helper()
	store := &state.Store{Root: filepath.Join(dir, "run")}
	qemu := filepath.Join(dir, "qemu")
	if err := os.WriteFile(qemu, []byte("#!/bin/sh\n"+qemuScript+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	kernel := filepath.Join(dir, "vmlinux")
	if err := os.WriteFile(kernel, []byte("not a kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults()
	cfg.Hypervisor.Path = qemu
	cfg.Hypervisor.Kernel = kernel
	cfg.Hypervisor.Initrd = ""
	cfg.Hypervisor.Firmware = ""
	cfg.Hypervisor.MachineType = "pc"
	h, err := store.Create("sb", state.Sandbox{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	sb, err := Boot(context.Background(), Options{ID: "sb", Config: &cfg, VCPUs: 1, MemoryMiB: 128, State: h, Failpoints: fps})
	if err == nil {
		sb.Stop(context.Background(), h)
		t.Fatal("Boot with a fake QEMU succeeded")
	}
	return store, err
}

func requireEmpty(t *testing.T, store *state.Store) {
	t.Helper()
	list, err := store.List()
	if err != nil || len(list) > 0 {
		t.Fatalf("store after a failed boot: %+v, %v", list, err)
	}
	ents, _ := os.ReadDir(store.Root)
	for _, e := range ents {
		t.Errorf("left in the store: %s", e.Name())
	}
}

// QEMU is recorded (pid 0), with the files it creates and the shared
// directory, before it is started; the failed boot releases everything.
func TestBootRecordsBeforeQEMUStarts(t *testing.T) {
	// QEMU may not read the sandbox's records (internal/fsguard): the
	// fake one says on its stderr (the sandbox's qemu.log) that it runs,
	// and the test reads the state then.
	dir := t.TempDir()
	sbDir := filepath.Join(dir, "run", "sb") // the store's directory of sandbox "sb"
	seen := make(chan []byte, 1)
	go func() {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if b, _ := os.ReadFile(filepath.Join(sbDir, "qemu.log")); strings.Contains(string(b), "fake qemu running") {
				st, _ := os.ReadFile(filepath.Join(sbDir, "state.json"))
				seen <- st
				return
			}
		}
		seen <- nil
	}()
	store, err := testBootIn(t, dir, `echo fake qemu running >&2; sleep 1; exit 1`, failpoint.Set{})
	if err == nil || !strings.Contains(err.Error(), "starting the VM") {
		t.Fatalf("Boot: %v", err)
	}
	b := <-seen
	if b == nil {
		t.Fatal("the fake QEMU did not run, or the state could not be read while it ran")
	}
	for _, want := range []string{`"role": "qemu"`, `"kind": "socket"`, `/agent.sock"`, `/qmp.sock"`, `/console.log"`, `/shared"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("state when QEMU started lacks %s:\n%s", want, b)
		}
	}
	requireEmpty(t, store)
}

// A failpoint before QEMU fails Boot with its name and leaves nothing.
func TestBootFailpointVMDir(t *testing.T) {
	store, err := testBoot(t, `exit 1`, failpoint.Parse(failpoint.VMDir))
	if !errors.Is(err, failpoint.ErrInjected) || !strings.Contains(err.Error(), "failpoint vm-dir: injected failure") {
		t.Fatalf("Boot: %v", err)
	}
	requireEmpty(t, store)
}
