// Command hostresidue lists what of Hull's tests is on this host: the
// processes, mounts, network namespaces, host links, cgroups, sockets and
// state roots a test run creates and must remove. hack/test.sh lists them
// before and after each suite; what a suite added and did not remove is a
// leak, and fails the suite, whichever test left it. A test's own leak
// check (test/e2e/harness Residue) looks only at that test's pods; this
// one looks at the whole host, so it also sees what a killed run left.
//
// Each line names one thing and stays the same from one listing to the
// next while that thing exists, so two listings can be compared with
// comm(1). It lists more than the tests make (every mount, every netns):
// only what appears between two listings counts.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/hull-runtime/hull/internal/mountinfo"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "usage: hostresidue (lists, one per line, what Hull's tests create on this host)")
		os.Exit(2)
	}
	lines, err := list()
	for _, l := range lines {
		fmt.Println(l)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostresidue:", err)
		os.Exit(1)
	}
}

// programs are the executables whose processes a test run starts, by
// the start of their name: none of them may outlive its suite.
var programs = []string{"qemu-system", "containerd", "hull", "critest", "runc", "virtiofsd"}

func list() ([]string, error) {
	var out []string
	add := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }

	// Processes of the programs a test runs (containerd and its shims,
	// QEMU, Hull's binaries, critest, runc), by pid and name.
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", d.Name(), "exe"))
		if err != nil {
			continue // a kernel thread, or gone
		}
		name := filepath.Base(strings.TrimSuffix(exe, " (deleted)"))
		for _, p := range programs {
			if strings.HasPrefix(name, p) {
				add("process %d %s", pid, name)
				break
			}
		}
	}

	// Every mount point of this mount namespace.
	ms, err := mountinfo.Read()
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		// The first `ip netns add` on a host bind-mounts /run/netns onto
		// itself (so namespaces bound in it propagate) and nothing undoes
		// it: host setup, not a resource. Each namespace's own mount under
		// it is still listed.
		if m.MountPoint == "/run/netns" {
			continue
		}
		add("mount %s", m.MountPoint)
	}

	// Named network namespaces (containerd's pods' cni-*, the harness's
	// hull-e2e-*), the host's links, containerd's shim sockets, Hull's
	// state roots and what is in them.
	for _, g := range []struct{ kind, glob string }{
		{"netns", "/run/netns/*"},
		{"link", "/sys/class/net/*"},
		{"socket", "/run/containerd/s/*"},
		{"state", "/run/hull-e2e-*"}, // a test containerd's Hull state root
		{"state", "/run/hull*/*"},    // a sandbox or template in any state root
	} {
		paths, _ := filepath.Glob(g.glob)
		for _, p := range paths {
			add("%s %s", g.kind, p)
		}
	}

	// Cgroups: a pod's (containerd puts a sandbox with no parent under
	// k8s.io) and the ones Hull's own tests make (hull-*), in each
	// hierarchy. Globbed, not cgroup.Hierarchies: runc also makes a pod's
	// cgroup in the named systemd hierarchy, which that leaves out.
	for _, glob := range []string{"/sys/fs/cgroup/*/k8s.io/*", "/sys/fs/cgroup/k8s.io/*", "/sys/fs/cgroup/*/hull*", "/sys/fs/cgroup/hull*"} {
		paths, _ := filepath.Glob(glob)
		for _, p := range paths {
			if fi, err := os.Stat(p); err == nil && fi.IsDir() {
				add("cgroup %s", p)
			}
		}
	}
	sort.Strings(out) // bytewise: hack/test.sh compares with LC_ALL=C comm
	return out, nil
}
