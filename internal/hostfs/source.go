package hostfs

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Kernel interfaces that a bind source must never be: a guest given any
// of them could reach the host's kernel state or devices.
var kernelFS = map[int64]string{
	unix.PROC_SUPER_MAGIC:    "procfs",
	unix.SYSFS_MAGIC:         "sysfs",
	unix.DEBUGFS_MAGIC:       "debugfs",
	unix.TRACEFS_MAGIC:       "tracefs",
	unix.SECURITYFS_MAGIC:    "securityfs",
	unix.BPF_FS_MAGIC:        "bpf",
	unix.DEVPTS_SUPER_MAGIC:  "devpts",
	unix.CGROUP_SUPER_MAGIC:  "cgroup",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2",
	unix.EFIVARFS_MAGIC:      "efivarfs",
	unix.PSTOREFS_MAGIC:      "pstore",
	0x62656570:               "configfs",
}

// OpenSource opens a bind mount source once, as an O_PATH descriptor the
// bind is then made from, and refuses one that is a symlink (the last
// component; the host's own path above it is resolved once, here) or that
// is on procfs, sysfs, debugfs or another kernel interface, or on the
// host's /dev (devtmpfs).
func OpenSource(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening bind mount source %s: %w", path, err)
	}
	if err := checkSource(fd, path); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func checkSource(fd int, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("checking bind mount source %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return fmt.Errorf("refusing bind mount source %s: it is a symlink", path)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return fmt.Errorf("checking bind mount source %s: %w", path, err)
	}
	if name, ok := kernelFS[int64(sfs.Type)]; ok {
		return fmt.Errorf("refusing bind mount source %s: it is on %s, a host kernel interface", path, name)
	}
	var dev unix.Stat_t
	if err := unix.Stat("/dev", &dev); err == nil && dev.Dev == st.Dev {
		return fmt.Errorf("refusing bind mount source %s: it is on the host's /dev", path)
	}
	return nil
}
