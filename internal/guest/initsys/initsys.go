// Package initsys is the guest's PID-1 setup written as data: the
// directories, mounts and links the agent needs, kernel module loading, the
// kernel command line, and powering off.
package initsys

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/guest/cgroup"
)

// Mount is one filesystem PID 1 mounts.
type Mount struct {
	Source, Target, FSType string
	Flags                  uintptr
	Data                   string
	// Optional mounts may fail (e.g. a filesystem the kernel lacks).
	Optional bool
}

// Symlink is one link PID 1 creates.
type Symlink struct{ Target, Link string }

const nosuid = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC

// Mounts is the guest's base filesystem, mounted in order.
var Mounts = []Mount{
	{Source: "proc", Target: "/proc", FSType: "proc", Flags: nosuid},
	{Source: "sysfs", Target: "/sys", FSType: "sysfs", Flags: nosuid},
	{Source: "devtmpfs", Target: "/dev", FSType: "devtmpfs", Flags: unix.MS_NOSUID, Data: "mode=0755"},
	{Source: "devpts", Target: "/dev/pts", FSType: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "newinstance,ptmxmode=0666,mode=0620,gid=5"},
	{Source: "shm", Target: "/dev/shm", FSType: "tmpfs", Flags: nosuid, Data: "mode=1777"},
	{Source: "tmpfs", Target: "/run", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=0755"},
	{Source: "tmpfs", Target: "/tmp", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"},
	{Source: "cgroup2", Target: "/sys/fs/cgroup", FSType: "cgroup2", Flags: nosuid, Data: "nsdelegate"},
}

// Symlinks the guest's /dev needs. /dev/ptmx points into the devpts
// instance mounted with newinstance, so opening it allocates there.
var Symlinks = []Symlink{
	{"/proc/self/fd", "/dev/fd"},
	{"/proc/self/fd/0", "/dev/stdin"},
	{"/proc/self/fd/1", "/dev/stdout"},
	{"/proc/self/fd/2", "/dev/stderr"},
	{"pts/ptmx", "/dev/ptmx"},
}

// Setup mounts the base filesystems and creates the links. Failures of
// required mounts are returned joined; setup continues past them.
func Setup(log *slog.Logger) error {
	var errs []error
	for _, m := range Mounts {
		if err := os.MkdirAll(m.Target, 0o755); err != nil {
			errs = append(errs, fmt.Errorf("creating %s: %w", m.Target, err))
			continue
		}
		err := unix.Mount(m.Source, m.Target, m.FSType, m.Flags, m.Data)
		if errors.Is(err, unix.EBUSY) {
			err = nil // already mounted (e.g. devtmpfs by the kernel)
		}
		if err != nil {
			err = fmt.Errorf("mounting %s on %s: %w", m.FSType, m.Target, err)
			if m.Optional {
				log.Warn("optional mount failed", "err", err)
				continue
			}
			errs = append(errs, err)
		}
	}
	for _, s := range Symlinks {
		// devtmpfs has a ptmx node of its own; replace it with the link.
		if s.Link == "/dev/ptmx" {
			os.Remove(s.Link)
		}
		if err := os.Symlink(s.Target, s.Link); err != nil && !errors.Is(err, os.ErrExist) {
			errs = append(errs, fmt.Errorf("linking %s: %w", s.Link, err))
		}
	}
	if err := cgroup.EnableControllers("/sys/fs/cgroup", cgroup.Controllers); err != nil {
		errs = append(errs, err)
	}
	if err := loopbackUp(); err != nil {
		log.Warn("bringing up lo failed", "err", err)
	}
	return errors.Join(errs...)
}

// loopbackUp is `ip link set lo up`.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// ModulesFile lists the kernel modules to load, one path per line, in
// dependency order.
const ModulesFile = "/etc/hull/modules"

// ParseModules reads a modules list: one absolute path a line; empty lines
// and lines starting with # are ignored.
func ParseModules(r io.Reader) ([]string, error) {
	var mods []string
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		if !strings.HasPrefix(s, "/") {
			return nil, fmt.Errorf("modules list line %d: %q is not an absolute path", line, s)
		}
		mods = append(mods, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading modules list: %w", err)
	}
	return mods, nil
}

// LoadModules loads the modules named in the list at path with
// finit_module. A missing list loads nothing; a module that fails is
// logged and skipped; one already loaded counts as loaded.
func LoadModules(log *slog.Logger, path string, load func(string) error) (loaded int, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("opening modules list: %w", err)
	}
	defer f.Close()
	mods, err := ParseModules(f)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	for _, m := range mods {
		if err := load(m); err != nil {
			log.Error("loading kernel module failed", "module", m, "err", err)
			continue
		}
		loaded++
	}
	log.Info("kernel modules loaded", "loaded", loaded, "listed", len(mods), "took", time.Since(start))
	return loaded, nil
}

// FinitModule loads one module file; EEXIST (already loaded) is success.
func FinitModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("finit_module %s: %w", path, err)
	}
	return nil
}

// Cmdline parses a kernel command line into key=value pairs; a bare key
// maps to "".
func Cmdline(data string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(data) {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

// ReadCmdline reads /proc/cmdline.
func ReadCmdline() map[string]string {
	data, _ := os.ReadFile("/proc/cmdline")
	return Cmdline(string(data))
}

// PowerOff syncs and powers the machine off. It returns only on failure.
func PowerOff() error {
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

// UnmountAll detaches every mount below / except the base ones, deepest
// first, for a clean shutdown. Errors are ignored: the machine goes down.
func UnmountAll() {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var targets []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 {
			targets = append(targets, f[4])
		}
	}
	for i := len(targets) - 1; i >= 0; i-- {
		switch targets[i] {
		case "/", "/proc", "/sys", "/dev":
			continue
		}
		unix.Unmount(targets[i], unix.MNT_DETACH)
	}
}
