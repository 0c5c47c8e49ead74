// Package storage makes a container's filesystems visible in its pod's
// VM: it mounts the rootfs containerd hands the shim, binds it and the
// spec's host bind mounts into the sandbox's shared directory (exported to
// the guest as one 9p share), and rewrites the OCI spec so that every path
// in it is a guest path.
package storage

import (
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/hull-runtime/hull/internal/hostfs"
)

// Guest-side layout of the shared directory.
const (
	// SharedTag is the 9p mount tag of a sandbox's shared directory.
	SharedTag = "hullshared"
	// GuestSharedDir is where the agent mounts the share.
	GuestSharedDir = "/run/hull/shared"
	// GuestShmDir is the pod's /dev/shm in the guest: one tmpfs that
	// every container of the pod binds, so they share it as on a host.
	GuestShmDir = "/run/hull/shm"
)

// ContainerDir is a container's directory inside the tree (host:
// <tree>/<id>, guest: GuestSharedDir/<id>).
func ContainerDir(treeDir, containerID string) string {
	return filepath.Join(treeDir, containerID)
}

// Bind is a host path bind-mounted into the shared directory, so that the
// guest sees it at GuestPath.
type Bind struct {
	// Source is the host path (file or directory).
	Source string
	// Target is the host path inside the shared directory.
	Target string
	// GuestPath is the same place seen from the guest.
	GuestPath string
	// Options: ReadOnly for "ro" (the top mount only, as runc does;
	// submounts stay writable), RecursiveReadOnly for "rro" (containerd
	// 2.x's recursive read-only), Slave for "rslave"/"rshared"/"slave"/
	// "shared" (host mounts made later under the source appear in the
	// guest).
	Options hostfs.BindOptions
}

// Plan is what GuestSpec decided for one container.
type Plan struct {
	// Spec is the rewritten spec the agent receives.
	Spec *specs.Spec
	// RootfsTarget is where the host rootfs is bound in the shared dir;
	// the guest sees it at Spec.Root.Path.
	RootfsTarget string
	// Binds are the spec's host bind mounts, in spec order.
	Binds []Bind
	// Dropped says which spec entries were left out and why (for logs).
	Dropped []string
}

// hostOnlyPrefixes are bind sources that name host devices or kernel
// interfaces: the guest has its own. A device node below /dev is dropped
// (the guest's own is used); /dev itself and anything of /proc or /sys is
// refused (refused), and so is a source on those filesystems reached
// another way (hostfs.OpenSource).
var hostOnlyPrefixes = []string{"/dev", "/proc", "/sys"}

// guestLocalTypes are filesystems the guest creates itself.
var guestLocalTypes = []string{"proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2"}

// GuestSpec rewrites a host OCI spec for the guest. treeDir is the
// sandbox's private tree on the host (what the guest sees at
// GuestSharedDir), hostname the pod's hostname
// (used when the spec joins the sandbox's UTS namespace by path). The
// input spec is not modified.
func GuestSpec(in *specs.Spec, containerID, treeDir, hostname string) (*Plan, error) {
	if in == nil || in.Process == nil {
		return nil, fmt.Errorf("oci spec of %s: process is missing", containerID)
	}
	s := *in // shallow copy; every field changed below is replaced, not mutated
	cdir := ContainerDir(treeDir, containerID)
	gdir := path.Join(GuestSharedDir, containerID)
	p := &Plan{Spec: &s, RootfsTarget: filepath.Join(cdir, "rootfs")}
	root := specs.Root{Path: path.Join(gdir, "rootfs")}
	if in.Root != nil {
		root.Readonly = in.Root.Readonly
	}
	s.Root = &root
	// Host hooks cannot run in the guest.
	if s.Hooks != nil {
		p.Dropped = append(p.Dropped, "hooks")
		s.Hooks = nil
	}

	s.Mounts = nil
	for i, m := range in.Mounts {
		switch {
		case isBind(m):
			src := filepath.Clean(m.Source)
			if filepath.Clean(m.Destination) == "/dev/shm" {
				// CRI binds the sandbox's shm directory: the pod's shm
				// lives in the guest instead.
				s.Mounts = append(s.Mounts, specs.Mount{Destination: m.Destination, Type: "bind", Source: GuestShmDir, Options: []string{"rbind", "nosuid", "nodev", "noexec"}})
				continue
			}
			if refused(src) {
				// containerd's CRI resolves a hostPath's symlinks: a
				// symlink to /proc arrives here as /proc.
				return nil, fmt.Errorf("oci spec of %s: refusing bind mount source %s for %s: the host's kernel interfaces and /dev are not shared", containerID, m.Source, m.Destination)
			}
			if hostOnly(src) {
				p.Dropped = append(p.Dropped, fmt.Sprintf("mount %s (host path %s)", m.Destination, m.Source))
				continue
			}
			name := "m" + strconv.Itoa(i) + "-" + sanitize(filepath.Base(m.Destination))
			b := Bind{
				Source:    src,
				Target:    filepath.Join(cdir, "mounts", name),
				GuestPath: path.Join(gdir, "mounts", name),
				Options: hostfs.BindOptions{
					ReadOnly:          slices.Contains(m.Options, "ro") || slices.Contains(m.Options, "rro"),
					RecursiveReadOnly: slices.Contains(m.Options, "rro"),
					Slave:             slices.ContainsFunc(m.Options, propagated),
				},
			}
			p.Binds = append(p.Binds, b)
			gm := m
			gm.Source = b.GuestPath
			gm.Type = "bind"
			gm.Options = guestBindOptions(m.Options)
			s.Mounts = append(s.Mounts, gm)
		case slices.Contains(guestLocalTypes, m.Type):
			s.Mounts = append(s.Mounts, m)
		default:
			p.Dropped = append(p.Dropped, fmt.Sprintf("mount %s (type %q)", m.Destination, m.Type))
		}
	}

	if in.Linux != nil {
		l := *in.Linux
		l.Namespaces = nil
		for _, ns := range in.Linux.Namespaces {
			if ns.Path == "" {
				l.Namespaces = append(l.Namespaces, ns)
				continue
			}
			switch ns.Type {
			case specs.UTSNamespace:
				// The sandbox's UTS namespace is a host path; a new one
				// with the pod's hostname is equivalent in the guest.
				l.Namespaces = append(l.Namespaces, specs.LinuxNamespace{Type: specs.UTSNamespace})
				if s.Hostname == "" {
					s.Hostname = hostname
				}
			default:
				// A path names a host namespace (the pod's netns, the
				// sandbox's ipc/pid): the agent then uses the guest's
				// own, which is the pod's.
				l.Namespaces = append(l.Namespaces, ns)
			}
		}
		// Host devices stay on the host (privileged_without_host_devices).
		if len(l.Devices) > 0 {
			p.Dropped = append(p.Dropped, fmt.Sprintf("%d host devices", len(l.Devices)))
			l.Devices = nil
		}
		s.Linux = &l
	}
	return p, nil
}

func isBind(m specs.Mount) bool {
	return m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}

// propagated says whether a mount option asks for host mounts to
// propagate into the bind.
func propagated(o string) bool {
	return o == "rslave" || o == "rshared" || o == "slave" || o == "shared"
}

// refused says whether src is /dev, or in /proc or /sys.
func refused(src string) bool {
	return src == "/dev" || src == "/proc" || src == "/sys" || strings.HasPrefix(src, "/proc/") || strings.HasPrefix(src, "/sys/")
}

func hostOnly(src string) bool {
	for _, p := range hostOnlyPrefixes {
		if src == p || strings.HasPrefix(src, p+"/") {
			return true
		}
	}
	return false
}

// sanitize keeps a path element readable and safe as a file name.
func sanitize(s string) string {
	s = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
	if s == "" || s == "." || s == ".." || s == "_" {
		return "root"
	}
	return s
}

// guestBindOptions are a bind's options in the guest. A non-recursive
// read-only bind ("ro" without "rro") is made read-only on the host
// (hostfs.BindOptions.ReadOnly: the top mount only, as runc does), and
// that holds for the guest: QEMU's writes there fail. In the guest the
// volume and the host's submounts under it are one 9p tree, so a
// read-only remount there would cover the submounts as well; "ro" is
// therefore not passed on. "rro" is (everything read-only, both sides).
func guestBindOptions(opts []string) []string {
	if slices.Contains(opts, "rro") {
		return slices.Clone(opts)
	}
	return slices.DeleteFunc(slices.Clone(opts), func(o string) bool { return o == "ro" })
}
