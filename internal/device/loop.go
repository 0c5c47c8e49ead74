package device

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/state"
)

// releaseLoop is the KindLoopDev releaser: it detaches the loop device
// at r.Path (or r.Key) when it is still attached to the backing file
// recorded in r.Data["backing"]; a loop device that is gone, free, or
// attached to another file (reused since) is released.
func releaseLoop(_ context.Context, r state.Resource) error {
	dev := r.Path
	if dev == "" {
		dev = r.Key
	}
	backing, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // not attached
	}
	if err != nil {
		return fmt.Errorf("loop device %s: %w", dev, err)
	}
	if want := r.Data["backing"]; want != "" && strings.TrimSpace(string(backing)) != want {
		return nil
	}
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("loop device %s: %w", dev, err)
	}
	defer f.Close()
	// losetup -d DEV
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && err != unix.ENXIO {
		return fmt.Errorf("detaching loop device %s: %w", dev, err)
	}
	return nil
}
