// Package cgroup places a sandbox's processes in the pod's cgroup: the
// sandbox spec's linux.cgroupsPath (Kata's sandbox_cgroup_only meaning),
// so that the limits kubelet sets on the pod's cgroup bound the VM.
//
// Only the cgroupfs form of cgroupsPath is acted on. The systemd form
// ("slice:prefix:name") is mapped to the path runc's systemd driver
// would use, but refused: that cgroup belongs to a systemd unit, and
// creating it by hand behind systemd's back breaks systemd's
// single-writer rule (docs/security.md, "QEMU confinement").
package cgroup

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hull-runtime/hull/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// Root is where the cgroup hierarchies are mounted.
const Root = "/sys/fs/cgroup"

// Path checks an OCI linux.cgroupsPath and returns it as a path relative
// to each hierarchy's root: absolute, clean, not "/", no "..". A
// systemd-form path ("slice:prefix:name", what containerd passes with
// the systemd cgroup driver, kubeadm's default) is the directory runc's
// systemd driver would give the unit (SystemdPath): under the pod's
// slice, so the limits kubelet puts there bound the VM. Hull makes that
// directory itself, as with cgroupfs paths; it asks systemd for no unit.
func Path(cgroupsPath string) (string, error) {
	if isSystemd(cgroupsPath) {
		p, err := SystemdPath(cgroupsPath)
		if err != nil {
			return "", fmt.Errorf("cgroupsPath %q: %w", cgroupsPath, err)
		}
		return p, nil
	}
	switch {
	case !strings.HasPrefix(cgroupsPath, "/"):
		return "", fmt.Errorf("cgroupsPath %q is not absolute", cgroupsPath)
	case filepath.Clean(cgroupsPath) != cgroupsPath || slices.Contains(strings.Split(cgroupsPath, "/"), ".."):
		return "", fmt.Errorf("cgroupsPath %q is not a clean path", cgroupsPath)
	case cgroupsPath == "/":
		return "", fmt.Errorf("cgroupsPath %q is the root cgroup", cgroupsPath)
	}
	return cgroupsPath, nil
}

// isSystemd reports whether p has the systemd driver's "slice:prefix:name"
// form.
func isSystemd(p string) bool {
	return !strings.HasPrefix(p, "/") && strings.Count(p, ":") == 2
}

// SystemdPath maps "slice:prefix:name" to the cgroupfs path runc's
// systemd driver uses: the slice expanded into its parents
// ("kubepods-burstable-pod1.slice" is
// /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice;
// "" is system.slice), then the unit "prefix-name.scope" (or name itself
// when it is a slice).
func SystemdPath(p string) (string, error) {
	parts := strings.Split(p, ":")
	if len(parts) != 3 {
		return "", fmt.Errorf("%q is not slice:prefix:name", p)
	}
	slice, prefix, name := parts[0], parts[1], parts[2]
	if slice == "" {
		slice = "system.slice"
	}
	dir, err := expandSlice(slice)
	if err != nil {
		return "", err
	}
	if name == "" || strings.Contains(name, "/") || strings.Contains(prefix, "/") {
		return "", fmt.Errorf("unit name %q (prefix %q) is empty or holds a slash", name, prefix)
	}
	unit := name
	if !strings.HasSuffix(name, ".slice") {
		unit = name + ".scope"
		if prefix != "" {
			unit = prefix + "-" + unit
		}
	}
	return filepath.Join(dir, unit), nil
}

// expandSlice turns a slice name into its cgroupfs path: each '-'
// separated prefix is a parent slice.
func expandSlice(slice string) (string, error) {
	base, ok := strings.CutSuffix(slice, ".slice")
	if !ok || base == "" || strings.Contains(base, "/") {
		return "", fmt.Errorf("slice %q is not a valid slice name", slice)
	}
	if base == "-" {
		return "/", nil
	}
	var path, prefix strings.Builder
	for i, comp := range strings.Split(base, "-") {
		if comp == "" {
			return "", fmt.Errorf("slice %q has an empty component", slice)
		}
		if i > 0 {
			prefix.WriteString("-")
		}
		prefix.WriteString(comp)
		path.WriteString("/" + prefix.String() + ".slice")
	}
	return path.String(), nil
}

// Hierarchy is one mounted cgroup hierarchy.
type Hierarchy struct {
	Mount string // mount point, e.g. /sys/fs/cgroup or /sys/fs/cgroup/memory
	V2    bool
	// Cpuset: a v1 cpuset hierarchy, whose new cgroups start with no
	// CPUs or memory nodes and must be given their parent's.
	Cpuset bool
	// Controllers of a v1 hierarchy, as /proc/<pid>/cgroup names them
	// ("cpu,cpuacct"); "" for v2.
	Controllers string
}

// Hierarchies returns the hierarchies a process is placed in: on a
// unified (v2) host /sys/fs/cgroup alone; on a v1 or hybrid host every v1
// hierarchy with controllers mounted under /sys/fs/cgroup (named ones
// such as name=systemd are left alone), and the hybrid cgroup2 one.
func Hierarchies() ([]Hierarchy, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(Root, &st); err != nil {
		return nil, fmt.Errorf("statfs %s: %w", Root, err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return []Hierarchy{{Mount: Root, V2: true}}, nil
	}
	ms, err := mountinfo.Read()
	if err != nil {
		return nil, err
	}
	return hierarchies(ms)
}

// hierarchies picks the cgroup mounts under Root from the mount table.
func hierarchies(ms []mountinfo.Mount) ([]Hierarchy, error) {
	var hs []Hierarchy
	seen := map[string]bool{} // one entry per hierarchy, however often mounted
	for _, m := range ms {
		if m.Root != "/" || !strings.HasPrefix(m.MountPoint, Root+"/") {
			continue
		}
		switch m.FSType {
		case "cgroup2":
			if !seen["cgroup2"] {
				seen["cgroup2"] = true
				hs = append(hs, Hierarchy{Mount: m.MountPoint, V2: true})
			}
		case "cgroup":
			var ctrls []string
			for _, o := range strings.Split(m.SuperOptions, ",") {
				if o == "rw" || o == "ro" || strings.Contains(o, "=") || o == "clone_children" ||
					o == "noprefix" || o == "xattr" || o == "cpuset_v2_mode" {
					continue
				}
				ctrls = append(ctrls, o)
			}
			key := strings.Join(ctrls, ",")
			if len(ctrls) == 0 || seen[key] {
				continue
			}
			seen[key] = true
			hs = append(hs, Hierarchy{Mount: m.MountPoint, Cpuset: slices.Contains(ctrls, "cpuset"), Controllers: key})
		}
	}
	if len(hs) == 0 {
		return nil, fmt.Errorf("no cgroup hierarchy mounted under %s", Root)
	}
	return hs, nil
}
