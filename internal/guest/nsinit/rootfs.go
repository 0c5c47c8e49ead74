package nsinit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// DefaultMounts are mounted unless the spec has a mount at the same
// destination.
var DefaultMounts = []specs.Mount{
	{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
	{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
	{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
	{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
	{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
}

// devNodes are made in a tmpfs /dev: runc's default nodes, character
// devices of mode 0666 (the device cgroup allows each of them).
var devNodes = []struct {
	name         string
	major, minor uint32
}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}

var devLinks = [][2]string{
	{"pts/ptmx", "ptmx"},
	{"/proc/self/fd", "fd"},
	{"/proc/self/fd/0", "stdin"},
	{"/proc/self/fd/1", "stdout"},
	{"/proc/self/fd/2", "stderr"},
	{"/proc/kcore", "core"},
}

// MergeMounts returns the defaults the spec does not override followed by
// the spec's mounts, stably ordered so a parent directory is mounted before
// what is mounted below it.
func MergeMounts(spec []specs.Mount) []specs.Mount {
	have := map[string]bool{}
	for _, m := range spec {
		have[filepath.Clean(m.Destination)] = true
	}
	var out []specs.Mount
	for _, m := range DefaultMounts {
		if !have[m.Destination] {
			out = append(out, m)
		}
	}
	out = append(out, spec...)
	depth := func(p string) int { return strings.Count(filepath.Clean(p), "/") }
	slices.SortStableFunc(out, func(a, b specs.Mount) int { return depth(a.Destination) - depth(b.Destination) })
	return out
}

// SecureJoin resolves path under root, following symlinks as if root were
// "/", so a link in the container cannot point the agent outside it.
func SecureJoin(root, path string) (string, error) {
	var resolved string // relative to root, always clean and absolute
	rest := strings.Split(filepath.Clean("/"+path), "/")
	for links := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			resolved = filepath.Dir("/" + resolved)
			if resolved == "/" {
				resolved = ""
			}
			continue
		}
		next := resolved + "/" + c
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			resolved = next // not a link, or does not exist yet
			continue
		}
		if links++; links > 40 {
			return "", fmt.Errorf("resolving %s: too many links", path)
		}
		if filepath.IsAbs(target) {
			resolved = ""
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return filepath.Join(root, resolved), nil
}

func setupRootfs(cfg *Config) error {
	root := cfg.Rootfs
	if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making / rslave: %w", err)
	}
	if err := unix.Mount(root, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting rootfs %s: %w", root, err)
	}
	// The rootfs comes from the share, mounted nosuid,nodev: the
	// container's own rootfs gets set-uid files and device nodes back, as
	// under runc (the device cgroup decides which devices open).
	if err := unix.Mount("", root, "", unix.MS_BIND|unix.MS_REMOUNT, ""); err != nil {
		return fmt.Errorf("remounting rootfs %s suid,dev: %w", root, err)
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening rootfs %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	devTmpfs := false
	for _, m := range MergeMounts(cfg.Mounts) {
		if err := mountOne(rootFD, m, cfg.Devpts); err != nil {
			return err
		}
		if filepath.Clean(m.Destination) == "/dev" && m.Type == "tmpfs" {
			devTmpfs = true
		}
	}
	if devTmpfs {
		if err := populateDev(filepath.Join(root, "dev")); err != nil {
			return err
		}
	}
	for _, d := range cfg.Devices {
		if err := createDevice(root, d); err != nil {
			return err
		}
	}
	if err := pivotRoot(root); err != nil {
		return err
	}
	for _, p := range cfg.MaskedPaths {
		if err := maskPath(p); err != nil {
			return err
		}
	}
	for _, p := range cfg.ReadonlyPaths {
		if err := readonlyPath(p); err != nil {
			return err
		}
	}
	if cfg.Readonly {
		if err := unix.Mount("", "/", "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remounting rootfs read-only: %w", err)
		}
	}
	return nil
}

func isBind(m specs.Mount) bool {
	if m.Type == "bind" {
		return true
	}
	return slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

// mountOne mounts m in the rootfs open at rootFD. The destination is
// resolved (and created) inside the rootfs through descriptors, and the
// mount made on the descriptor's /proc/self/fd path, so a symlink swapped
// in by a container sharing a volume cannot move it outside (the fix of
// runc's CVE-2021-30465). devpts is the container's devpts instance.
func mountOne(rootFD int, m specs.Mount, devpts string) error {
	if !filepath.IsAbs(m.Destination) {
		return fmt.Errorf("mount destination %q is not absolute", m.Destination)
	}
	flags, prop, data := ParseMountOptions(m.Options)
	typ := m.Type
	if typ == "devpts" && filepath.Clean(m.Destination) == "/dev/pts" && devpts != "" {
		// The agent mounted the container's own instance (its ptys come
		// from there); it is bound here with its own options.
		m = specs.Mount{Destination: m.Destination, Type: "bind", Source: devpts, Options: []string{"bind", "nosuid", "noexec", "dev"}}
		flags, prop, data = ParseMountOptions(m.Options)
	}
	if typ == "cgroup" {
		typ = "cgroup2" // the guest is cgroup v2 only
		data = ""
	}
	if isBind(m) {
		// The source is looked up once (on the share, each lookup is a
		// round trip to QEMU) and bound from its descriptor.
		src, isDir, err := openSource(m.Source)
		if err != nil {
			return err
		}
		defer unix.Close(src)
		fd, err := openTarget(rootFD, m.Destination, isDir)
		if err != nil {
			return err
		}
		err = unix.Mount(fdPath(src), fdPath(fd), "", unix.MS_BIND|(flags&unix.MS_REC), "")
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("bind-mounting %s on %s: %w", m.Source, m.Destination, err)
		}
		// Binds from the share are nosuid,nodev unless the spec says
		// "suid" or "dev".
		rest := flags &^ (unix.MS_BIND | unix.MS_REC)
		if !slices.Contains(m.Options, "suid") {
			rest |= unix.MS_NOSUID
		}
		if !slices.Contains(m.Options, "dev") {
			rest |= unix.MS_NODEV
		}
		if err := remountAt(rootFD, m.Destination, unix.MS_BIND|unix.MS_REMOUNT|rest); err != nil {
			return fmt.Errorf("remounting %s with %v: %w", m.Destination, m.Options, err)
		}
	} else {
		fd, err := openTarget(rootFD, m.Destination, true)
		if err != nil {
			return err
		}
		// sysfs and others reject MS_RDONLY with some data; mount, then
		// remount read-only.
		ro := flags & unix.MS_RDONLY
		err = unix.Mount(m.Source, fdPath(fd), typ, flags&^unix.MS_RDONLY, data)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("mounting %s on %s: %w", typ, m.Destination, err)
		}
		if ro != 0 {
			// MS_BIND makes the remount change this mount point only:
			// sysfs (same netns) and cgroup2 share the guest's
			// superblock, which must stay writable for the agent.
			if err := remountAt(rootFD, m.Destination, unix.MS_REMOUNT|unix.MS_BIND|flags); err != nil {
				return fmt.Errorf("remounting %s read-only: %w", m.Destination, err)
			}
		}
	}
	if prop != 0 {
		if err := remountAt(rootFD, m.Destination, prop); err != nil {
			return fmt.Errorf("setting propagation of %s: %w", m.Destination, err)
		}
	}
	return nil
}

// openSource opens a bind mount's source (symlinks followed, as mount(2)
// followed them when it was given the path) as an O_PATH descriptor, and
// says whether it is a directory: the object whose type decides the
// mount point is the one bound, with no second lookup between them.
func openSource(path string) (fd int, isDir bool, err error) {
	fd, err = unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, false, fmt.Errorf("bind mount source %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, false, fmt.Errorf("bind mount source %s: %w", path, err)
	}
	return fd, st.Mode&unix.S_IFMT == unix.S_IFDIR, nil
}

// populateDev fills the container's fresh /dev tmpfs. The nodes are made
// with mknod, as runc makes them outside a user namespace (the guest has
// none), not bound from the agent's /dev: a bind is a mount per node, each
// 2-3 ms under TCG. They are chmod'ed after: mknod's mode is narrowed by
// the helper's umask.
func populateDev(dev string) error {
	for _, n := range devNodes {
		dst := filepath.Join(dev, n.name)
		// mknod DST c MAJOR MINOR
		if err := unix.Mknod(dst, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return fmt.Errorf("creating /dev/%s (c %d:%d): %w", n.name, n.major, n.minor, err)
		}
		if err := unix.Chmod(dst, 0o666); err != nil {
			return fmt.Errorf("creating /dev/%s: %w", n.name, err)
		}
	}
	for _, l := range devLinks {
		if err := os.Symlink(l[0], filepath.Join(dev, l[1])); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("linking /dev/%s: %w", l[1], err)
		}
	}
	return nil
}

// pivotRoot makes root the process's / and detaches the old root.
func pivotRoot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("chdir to rootfs: %w", err)
	}
	// Stack the old root under the new one, then detach it.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Mount("", ".", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making old root rslave: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	return nil
}

func maskPath(p string) error {
	st, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("masking %s: %w", p, err)
	}
	if st.IsDir() {
		err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY, "")
	} else {
		err = unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
	}
	if err != nil {
		return fmt.Errorf("masking %s: %w", p, err)
	}
	return nil
}

func readonlyPath(p string) error {
	if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("binding %s read-only: %w", p, err)
	}
	if err := unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("remounting %s read-only: %w", p, err)
	}
	return nil
}

// createDevice makes the node d in the container (mknod, then the
// spec's owner and permission bits), replacing what is at its path.
func createDevice(root string, d Device) error {
	// The parent is resolved inside the container; the last component is
	// not followed (/dev/ptmx is a link into devpts: the link is replaced).
	parent, err := SecureJoin(root, filepath.Dir(d.Path))
	if err != nil {
		return err
	}
	p := filepath.Join(parent, filepath.Base(d.Path))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("device %s: %w", d.Path, err)
	}
	mode := uint32(unix.S_IFCHR)
	if d.Type == "b" {
		mode = unix.S_IFBLK
	}
	// A bind-mounted default node (/dev/null, ...) is unmounted first.
	_ = unix.Unmount(p, unix.MNT_DETACH)
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("device %s: %w", d.Path, err)
	}
	// mknod PATH TYPE MAJOR MINOR
	if err := unix.Mknod(p, mode|(d.Mode&0o7777), int(unix.Mkdev(uint32(d.Major), uint32(d.Minor)))); err != nil {
		return fmt.Errorf("device %s (%s %d:%d): mknod: %w", d.Path, d.Type, d.Major, d.Minor, err)
	}
	if err := unix.Chmod(p, d.Mode&0o7777); err != nil {
		return fmt.Errorf("device %s: %w", d.Path, err)
	}
	if err := unix.Chown(p, int(d.UID), int(d.GID)); err != nil {
		return fmt.Errorf("device %s: %w", d.Path, err)
	}
	return nil
}
