package sandbox

import (
	"fmt"
	"os"

	"github.com/moby/sys/mountinfo"

	"github.com/hull-runtime/hull/internal/storage"
)

// Tracker records each resource of a sandbox before it is acquired, so
// that a crash leaves a record the release path can act on.
type Tracker interface {
	RecordDir(path string) error
	// RecordQEMU records QEMU (pid 0: about to start).
	RecordQEMU(pid int) error
	storage.Recorder
}

// NopTracker records nothing: the release path then works from the
// sandbox directory alone (everything the sandbox holds lives below it).
type NopTracker struct{}

func (NopTracker) RecordDir(string) error   { return nil }
func (NopTracker) RecordQEMU(int) error     { return nil }
func (NopTracker) RecordMount(string) error { return nil }

// Release removes a sandbox directory: every mount below it is unmounted
// first, so removal can never reach into a container's rootfs or a
// volume. QEMU dies with the shim that started it (parent-death signal),
// so only what is on disk can outlive a crash. Idempotent.
func Release(dir string) error {
	if _, err := os.Lstat(dir); os.IsNotExist(err) {
		return nil
	}
	if err := storage.Unmount(dir); err != nil {
		return err
	}
	left, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("checking mounts under %s: %w", dir, err)
	}
	if len(left) > 0 {
		return fmt.Errorf("releasing %s: %s is still mounted", dir, left[0].Mountpoint)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}
