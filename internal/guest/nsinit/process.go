package nsinit

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"unsafe"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/guest/caps"
	"github.com/hull-runtime/hull/internal/guest/seccomp"
	"github.com/hull-runtime/hull/internal/guest/sysctl"
)

// defaultUmask is runc's when process.user.umask is unset.
const defaultUmask = 0o022

// prepareProcess runs first, while the helper still sees the guest's /proc
// and holds every capability: the process's oom_score_adj, and in create
// mode the sysctls, written in the container's new namespaces (the kernel
// resolves /proc/sys/kernel/shm* and /proc/sys/net/* by the writer's ipc
// and network namespace, not by the proc mount).
func prepareProcess(cfg *Config) error {
	if adj := cfg.Process.OOMScoreAdj; adj != nil {
		if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(*adj)), 0o644); err != nil {
			return fmt.Errorf("setting oom_score_adj to %d: %w", *adj, err)
		}
	}
	if cfg.Mode == ModeCreate && len(cfg.Sysctl) > 0 {
		if err := sysctl.Write("/proc/sys", cfg.Sysctl); err != nil {
			return err
		}
	}
	return nil
}

// setupProcess gives the calling thread the process's privileges in runc's
// order (libcontainer/standard_init_linux.go, init_linux.go): rlimits; the
// seccomp filter now if no_new_privs is off (loading it then needs
// CAP_SYS_ADMIN); the bounding set; keepcaps, user and groups, capset and
// ambient; umask; no_new_privs. With no_new_privs the filter is returned,
// to be loaded last before execve.
func setupProcess(cfg *Config) (late *seccomp.Filter, err error) {
	p := &cfg.Process
	for _, r := range p.Rlimits {
		res, ok := rlimits[r.Type]
		if !ok {
			return nil, fmt.Errorf("unknown rlimit %q", r.Type)
		}
		if err := unix.Setrlimit(res, &unix.Rlimit{Cur: r.Soft, Max: r.Hard}); err != nil {
			return nil, fmt.Errorf("setting %s: %w", r.Type, err)
		}
	}
	last := caps.LastCap()
	// No capabilities in the spec means none, as runc reads it (every
	// caller that wants some names them: CRI, ctr, hull run).
	sets := &caps.Sets{}
	if p.Capabilities != nil {
		s, err := caps.ParseAll(p.Capabilities, last)
		if err != nil {
			return nil, err
		}
		sets = &s
	}
	var filter *seccomp.Filter
	if cfg.Seccomp != nil {
		if filter, err = seccomp.New(cfg.Seccomp); err != nil {
			return nil, fmt.Errorf("compiling seccomp profile: %w", err)
		}
		if !p.NoNewPrivileges {
			if err := filter.Load(); err != nil {
				return nil, err
			}
			filter = nil
		}
	}
	if err := caps.DropBounding(sets.Bounding, last); err != nil {
		return nil, err
	}
	if err := caps.SetKeepCaps(true); err != nil {
		return nil, err
	}
	if err := setUser(p.User); err != nil {
		return nil, err
	}
	if err := caps.SetKeepCaps(false); err != nil {
		return nil, err
	}
	if err := caps.Apply(*sets); err != nil {
		return nil, err
	}
	umask := uint32(defaultUmask)
	if p.User.Umask != nil {
		umask = *p.User.Umask
	}
	unix.Umask(int(umask))
	if err := resetSignals(); err != nil {
		return nil, err
	}
	if p.NoNewPrivileges {
		// prctl(PR_SET_NO_NEW_PRIVS, 1)
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("setting no_new_privs: %w", err)
		}
	}
	return filter, nil
}

// sigaction is the kernel's struct sigaction on x86_64.
type sigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

// resetSignals gives every signal its default action: the agent ignores
// the signals it does not use, and execve keeps ignored signals ignored.
func resetSignals() error {
	act := sigaction{handler: 0} // SIG_DFL
	for sig := 1; sig <= 64; sig++ {
		if sig == int(unix.SIGKILL) || sig == int(unix.SIGSTOP) {
			continue
		}
		// rt_sigaction(sig, {SIG_DFL}, NULL, sizeof(sigset_t))
		_, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0)
		if errno != 0 && errno != unix.EINVAL {
			return fmt.Errorf("resetting the action of signal %d: %w", sig, errno)
		}
	}
	return nil
}

// setUser sets the groups, gid and uid; with keepcaps set the permitted
// capabilities survive.
func setUser(u specs.User) error {
	groups := make([]int, 0, len(u.AdditionalGids))
	for _, g := range u.AdditionalGids {
		groups = append(groups, int(g))
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setting supplementary groups %v: %w", u.AdditionalGids, err)
	}
	if err := syscall.Setgid(int(u.GID)); err != nil {
		return fmt.Errorf("setting gid %d: %w", u.GID, err)
	}
	if err := syscall.Setuid(int(u.UID)); err != nil {
		return fmt.Errorf("setting uid %d: %w", u.UID, err)
	}
	return nil
}
