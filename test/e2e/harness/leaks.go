package harness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/internal/mountinfo"
)

// Residue lists what is left on the host of the objects (pods, containers)
// with the given ids, waiting up to wait for all of it to be gone:
//   - a process whose command line names an id (the shim runs with
//     `-id <id>`; QEMU's sockets and shared directory lie in
//     <StateDir>/<sandbox-id>),
//   - a mount whose mount point names an id (rootfs overlays, /dev/shm,
//     the shared directory),
//   - <StateDir>/<id>,
//   - a file or directory named after an id in containerd's root or state
//     (bundles, sockets, CRI's sandbox directories),
//   - the socket a shim on containerd's shim package listens on, and
//     any bound unix socket whose path names an id,
//   - the given extra paths (a pod's network namespace).
//
// containerd cleans up after a dead shim asynchronously (a CRI call can
// return before it is done), so the check is repeated until nothing is
// left or wait has passed.
func (c *Containerd) Residue(wait time.Duration, ids []string, extra ...string) []error {
	deadline := time.Now().Add(wait)
	for {
		errs := c.residueOnce(ids, extra)
		if len(errs) == 0 || time.Now().After(deadline) {
			return errs
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *Containerd) residueOnce(ids []string, extra []string) []error {
	var errs []error
	for _, p := range leakcheck.Processes(ids) {
		errs = append(errs, fmt.Errorf("process %d still running: %s", p.Pid, p.Cmdline))
	}
	if ms, err := mountinfo.Read(); err == nil {
		for _, m := range ms {
			for _, id := range ids {
				if strings.Contains(m.MountPoint, id) {
					errs = append(errs, fmt.Errorf("mount still present: %s", m.MountPoint))
					break
				}
			}
		}
	}
	for _, id := range ids {
		if _, err := os.Lstat(filepath.Join(c.StateDir, id)); err == nil {
			errs = append(errs, fmt.Errorf("state directory still present: %s", filepath.Join(c.StateDir, id)))
		}
	}
	for _, dir := range []string{c.Root, c.State} {
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			for _, id := range ids {
				if strings.Contains(d.Name(), id) {
					errs = append(errs, fmt.Errorf("left in containerd's directory: %s", p))
					if d.IsDir() {
						return fs.SkipDir
					}
					return nil
				}
			}
			return nil
		})
	}
	// The socket of a shim built on containerd's shim package (runc's):
	// /run/containerd/s/<sha256 of address/namespace/id>.
	for _, id := range ids {
		for _, ns := range []string{CRINamespace, "default"} {
			sum := sha256.Sum256([]byte(filepath.Join(c.Socket, ns, id)))
			sock := filepath.Join("/run/containerd/s", hex.EncodeToString(sum[:]))
			if _, err := os.Lstat(sock); err == nil {
				errs = append(errs, fmt.Errorf("shim socket still present: %s (namespace %s, id %s)", sock, ns, id))
			}
		}
	}
	// Listening unix sockets whose path names an id, in the host's and
	// containerd's network namespaces (shims run in containerd's).
	tables := []string{"/proc/self/net/unix"}
	if pid := c.Pid(); pid != 0 {
		tables = append(tables, fmt.Sprintf("/proc/%d/net/unix", pid))
	}
	seen := map[string]bool{}
	for _, table := range tables {
		b, _ := os.ReadFile(table)
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 || seen[f[7]] {
				continue
			}
			for _, id := range ids {
				if strings.Contains(f[7], id) {
					seen[f[7]] = true
					errs = append(errs, fmt.Errorf("unix socket still bound: %s", f[7]))
					break
				}
			}
		}
	}
	for _, p := range extra {
		if p == "" {
			continue
		}
		if _, err := os.Lstat(p); err == nil {
			errs = append(errs, fmt.Errorf("still present: %s", p))
		}
	}
	return errs
}

// PodNetns returns the path of the pod's network namespace, from the
// verbose PodSandboxStatus ("" when containerd does not say).
func (c *CRI) PodNetns(ctx context.Context, podID string) (string, error) {
	st, err := c.PodSandboxStatus(ctx, &runtime.PodSandboxStatusRequest{PodSandboxId: podID, Verbose: true})
	if err != nil {
		return "", err
	}
	var info struct {
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct {
					Type string `json:"type"`
					Path string `json:"path"`
				} `json:"namespaces"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
		return "", fmt.Errorf("verbose status of %s: %w", podID, err)
	}
	for _, ns := range info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			return ns.Path, nil
		}
	}
	return "", nil
}

// ShimProcesses lists the running processes of the shim binary name
// (e.g. "containerd-shim-hull-v2") that serve this containerd.
func (c *Containerd) ShimProcesses(name string) []leakcheck.Process {
	var out []leakcheck.Process
	for _, p := range leakcheck.Processes([]string{c.Socket}) {
		if strings.Contains(strings.Fields(p.Cmdline)[0], name) {
			out = append(out, p)
		}
	}
	return out
}

// QEMUProcesses lists the running QEMU processes whose parent is one of
// this containerd's hull shims, or whose command line names one of ids.
func (c *Containerd) QEMUProcesses(ids ...string) []leakcheck.Process {
	shims := map[int]bool{}
	for _, p := range c.ShimProcesses("containerd-shim-hull-v2") {
		shims[p.Pid] = true
	}
	var out []leakcheck.Process
	for _, p := range leakcheck.Processes([]string{"qemu-system"}) {
		if !leakcheck.IsQEMU(p.Cmdline) {
			continue
		}
		mine := shims[ppid(p.Pid)]
		for _, id := range ids {
			mine = mine || strings.Contains(p.Cmdline, id)
		}
		if mine {
			out = append(out, p)
		}
	}
	return out
}

func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	var n int
	fmt.Sscanf(f[1], "%d", &n)
	return n
}

// RSS returns a process's resident set size in bytes (VmRSS).
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(l, "VmRSS:")), "%d", &kb)
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}
