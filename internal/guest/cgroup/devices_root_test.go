package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/ebpf"
)

func v2Root(t *testing.T) string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	for _, p := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p
		}
	}
	t.Skip("needs a cgroup v2 hierarchy")
	return ""
}

// runIn runs a busybox shell script in cg and returns its output.
func runIn(t *testing.T, cg *Cgroup, script string) string {
	t.Helper()
	dir, err := cg.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	cmd := exec.Command("busybox", "sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// containerdDefault is the device list of containerd's default spec.
func containerdDefault() []specs.LinuxDeviceCgroup {
	i := func(v int64) *int64 { return &v }
	return []specs.LinuxDeviceCgroup{
		{Allow: false, Access: "rwm"},
		{Allow: true, Type: "c", Major: i(1), Minor: i(3), Access: "rwm"},
		{Allow: true, Type: "c", Major: i(136), Access: "rwm"},
	}
}

const probe = `
probe() { if sh -c "$2" 2>/dev/null; then echo "$1 ok"; else echo "$1 denied"; fi; }
probe null 'exec 3</dev/null'
probe loop0 'exec 3</dev/loop0'
probe mknod-b 'mknod %[1]s/b b 7 0'
probe open-b 'exec 3<%[1]s/b'
probe mknod-c 'mknod %[1]s/c c 10 237'
probe open-c 'exec 3<%[1]s/c'
`

func TestDeviceProgram(t *testing.T) {
	root := v2Root(t)
	if _, err := os.Stat("/dev/loop0"); err != nil {
		t.Skip("needs /dev/loop0")
	}
	for _, tc := range []struct {
		name  string
		rules []specs.LinuxDeviceCgroup
		want  string
	}{
		// As runc: mknod is allowed (and refused by the missing
		// CAP_MKNOD in a default container), opening is not.
		{"default", containerdDefault(), "null ok,loop0 denied,mknod-b ok,open-b denied,mknod-c ok,open-c denied"},
		{"privileged", []specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}, "null ok,loop0 ok,mknod-b ok,open-b ok,mknod-c ok,open-c ok"},
		{"deny-after-allow", append([]specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}},
			specs.LinuxDeviceCgroup{Allow: false, Type: "b", Access: "r"}), "null ok,loop0 denied,mknod-b ok,open-b denied,mknod-c ok,open-c ok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cg, err := Create(filepath.Join(root, fmt.Sprintf("hull-devtest-%d", os.Getpid())), tc.name)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cg.Remove()
				unix.Rmdir(filepath.Dir(cg.Path))
			})
			rules, err := SpecDeviceRules(tc.rules)
			if err != nil {
				t.Fatal(err)
			}
			// Rules after the spec's, as runc appends them.
			if err := cg.SetDevices(append(rules, AlwaysAllowed...)); err != nil {
				t.Fatal(err)
			}
			tmp := t.TempDir()
			out := runIn(t, cg, fmt.Sprintf(probe, tmp))
			got := strings.ReplaceAll(strings.TrimSpace(out), "\n", ",")
			if got != tc.want {
				t.Errorf("got  %s\nwant %s\n(output %q)", got, tc.want, out)
			}
		})
	}
}

func TestSpecDeviceRulesRejects(t *testing.T) {
	if _, err := SpecDeviceRules([]specs.LinuxDeviceCgroup{{Type: "x"}}); err == nil {
		t.Error("type x accepted")
	}
	if _, err := SpecDeviceRules([]specs.LinuxDeviceCgroup{{Type: "c", Access: "rx"}}); err == nil {
		t.Error("access x accepted")
	}
}

// attachedProgram is the id of the device program attached to the cgroup
// at path (bpf BPF_PROG_QUERY), 0 without one.
func attachedProgram(t *testing.T, path string) uint32 {
	t.Helper()
	dir, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	ids := make([]uint32, 4)
	// union bpf_attr, query: target_fd, attach_type, query_flags,
	// attach_flags, prog_ids, prog_cnt.
	attr := struct {
		targetFD, attachType, queryFlags, attachFlags uint32
		progIDs                                       uint64
		progCnt                                       uint32
		_                                             uint32
	}{targetFD: uint32(dir.Fd()), attachType: unix.BPF_CGROUP_DEVICE, progIDs: uint64(uintptr(unsafe.Pointer(&ids[0]))), progCnt: uint32(len(ids))}
	if _, err := ebpf.Syscall(unix.BPF_PROG_QUERY, unsafe.Pointer(&attr), unsafe.Sizeof(attr)); err != nil {
		t.Fatalf("querying the device program of %s: %v", path, err)
	}
	if attr.progCnt != 1 {
		t.Fatalf("%s has %d device programs attached, want 1", path, attr.progCnt)
	}
	return ids[0]
}

// Containers with the same rules share one loaded program (the agent
// preloads the default rules'); other rules get their own; at most
// maxPrograms stay loaded.
func TestSameRulesShareOneProgram(t *testing.T) {
	root := filepath.Join(v2Root(t), fmt.Sprintf("hull-progtest-%d", os.Getpid()))
	if err := PreloadDevices(DefaultDeviceRules()); err != nil {
		t.Fatal(err)
	}
	var cgs []*Cgroup
	for _, name := range []string{"a", "b", "c"} {
		cg, err := Create(root, name)
		if err != nil {
			t.Fatal(err)
		}
		cgs = append(cgs, cg)
	}
	t.Cleanup(func() {
		for _, cg := range cgs {
			cg.Remove()
		}
		unix.Rmdir(root)
	})
	for _, cg := range cgs[:2] {
		if err := cg.SetDevices(DefaultDeviceRules()); err != nil {
			t.Fatal(err)
		}
	}
	other := append([]DeviceRule{{Allow: true, Type: 'c', Major: 10, Minor: 237, Access: "rw"}}, DefaultDeviceRules()...)
	if err := cgs[2].SetDevices(other); err != nil {
		t.Fatal(err)
	}
	a, b, c := attachedProgram(t, cgs[0].Path), attachedProgram(t, cgs[1].Path), attachedProgram(t, cgs[2].Path)
	if a != b || a == c {
		t.Errorf("program ids %d, %d (same rules) and %d (other rules): want the first two equal, the third different", a, b, c)
	}
	for minor := int64(0); minor < maxPrograms+2; minor++ {
		if err := PreloadDevices([]DeviceRule{{Allow: true, Type: 'c', Major: 1, Minor: minor, Access: "r"}}); err != nil {
			t.Fatal(err)
		}
	}
	programs.mu.Lock()
	n, m := len(programs.fds), len(programs.order)
	programs.mu.Unlock()
	if n != maxPrograms || m != maxPrograms {
		t.Errorf("%d programs kept (%d in order), want %d", n, m, maxPrograms)
	}
	// The attached programs outlive their eviction from the cache.
	if got := attachedProgram(t, cgs[0].Path); got != a {
		t.Errorf("cgroup a's program is %d after evictions, want %d", got, a)
	}
}
