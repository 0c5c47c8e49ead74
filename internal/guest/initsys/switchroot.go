package initsys

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// switchedEnv marks the agent re-executed on its new root.
const switchedEnv = "HULL_SWITCHED_ROOT"

// newRoot is where the tmpfs root is built before it is moved onto /.
const newRoot = "/.hull-root"

// SwitchRoot moves PID 1 off the initramfs: the kernel's initial rootfs
// can never be pivot_root'ed away, so containers could only be chrooted.
// Like busybox's switch_root, it copies the initramfs into a tmpfs
// (deleting each original to give its memory back), moves the tmpfs onto
// / and chroots into it. The process goes on where it is: chroot changes
// the root of every thread (Go's threads share one fs_struct), and
// /proc/self/exe still reaches the running binary. It does nothing when
// the switch has already happened. The paths in drop (files or whole
// directories) are removed instead of copied.
//
// self, the running binary, is neither copied nor removed, and the
// initramfs is made read-only before the switch: the agent re-executes
// /proc/self/exe as the container helper, and a container process that
// reaches a helper's (or a forked agent's) /proc/PID/exe cannot open the
// agent's binary for writing (EROFS; runc's CVE-2019-5736), whatever the
// kernel does about writes to a running binary. The helper's code is the
// agent's own pages (docs/security.md).
func SwitchRoot(self string, drop ...string) error {
	if os.Getenv(switchedEnv) != "" || os.Getpid() != 1 {
		return nil
	}
	if err := os.Mkdir(newRoot, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", newRoot, err)
	}
	// mount -t tmpfs -o mode=0755 tmpfs /.hull-root
	if err := unix.Mount("tmpfs", newRoot, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mounting tmpfs on %s: %w", newRoot, err)
	}
	if err := moveTree("/", newRoot, self, drop); err != nil {
		return err
	}
	// mount -o remount,ro /: the initramfs now holds self and device
	// nodes. A file unlinked while still open would make this EBUSY,
	// hence those kept.
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("making the initramfs, which holds %s, read-only: %w", self, err)
	}
	if err := os.Chdir(newRoot); err != nil {
		return err
	}
	// mount --move /.hull-root /
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving %s onto /: %w", newRoot, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot into the new root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	return os.Setenv(switchedEnv, "1")
}

// ModulesDir holds the kernel modules in the initramfs.
const ModulesDir = "/lib/modules"

// moveTree copies every file under src (except dst, keep and drop) into
// dst, removing each original once copied (device nodes are left); drop
// is removed, keep left.
func moveTree(src, dst, keep string, drop []string) error {
	dropped := map[string]bool{}
	for _, d := range drop {
		dropped[d] = true
	}
	var dirs []string
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == dst {
			return filepath.SkipDir
		}
		if path == keep {
			return nil
		}
		if dropped[path] {
			if err := os.RemoveAll(path); err != nil {
				return err
			}
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := info.Sys().(*syscall.Stat_t)
		mode := info.Mode()
		switch {
		case mode.IsDir():
			if rel != "." {
				if err := os.Mkdir(target, mode.Perm()); err != nil && !errors.Is(err, os.ErrExist) {
					return err
				}
				dirs = append(dirs, path)
			}
			return nil
		case mode&os.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case mode.IsRegular():
			if err := copyFile(path, target, mode.Perm()); err != nil {
				return err
			}
		case st != nil:
			if err := unix.Mknod(target, st.Mode, int(st.Rdev)); err != nil {
				return fmt.Errorf("mknod %s: %w", target, err)
			}
			// The original stays: a node holds no memory, and the
			// kernel opened /dev/console as PID 1's stdio (an open
			// file unlinked keeps the initramfs from going read-only).
			return nil
		}
		return os.Remove(path)
	})
	if err != nil {
		return fmt.Errorf("copying the initramfs into tmpfs: %w", err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		os.Remove(dirs[i])
	}
	return nil
}

func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
