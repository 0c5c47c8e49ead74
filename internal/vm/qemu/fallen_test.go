package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/fsguard"
	"github.com/hull-runtime/hull/internal/testenv"
	"github.com/hull-runtime/hull/internal/vm"
)

// isFallenQEMU tells the test binary, started by Start in QEMU's place,
// with QEMU's arguments, that it is to act as a QEMU the guest took over.
func isFallenQEMU() bool { return slices.Contains(os.Args[1:], "-nodefaults") }

// fallenMain tries, with QEMU's confinement, what a QEMU that fell to its
// guest would: the host's files beside its VM, the records in its VM's
// directory, the process that started it (the shim). It finds its share
// and directory in its arguments, as QEMU does, and writes one "name
// result" line per attempt to results in its share.
func fallenMain() int {
	dir, _ := os.Getwd() // Start runs QEMU in its VM's directory
	var share, memory string
	for i, a := range os.Args {
		if i == 0 {
			continue
		}
		for _, kv := range strings.Split(a, ",") {
			if p, ok := strings.CutPrefix(kv, "path="); ok {
				if os.Args[i-1] == "-fsdev" {
					share = p
				}
			}
			if p, ok := strings.CutPrefix(kv, "mem-path="); ok {
				memory = p
			}
		}
	}
	var out strings.Builder
	report := func(name string, err error) { fmt.Fprintln(&out, name, testenv.Outcome(err)) }
	// What QEMU needs: its share, the sockets it was given.
	report("share-write", os.WriteFile(filepath.Join(share, "guest-file"), []byte("x"), 0o644))
	sa, err := unix.Getsockname(qmpFD)
	if err == nil {
		if un, ok := sa.(*unix.SockaddrUnix); !ok || un.Name != filepath.Join(dir, qmpSockName) {
			err = fmt.Errorf("fd %d is %v", qmpFD, sa)
		}
	}
	report("qmp-socket", err)
	// A socket of its own, for the host's services (containerd's).
	_, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	report("socket", err)
	// The host's files: beside the VM, by path and from the share up.
	host := filepath.Join(filepath.Dir(dir), "host")
	_, err = os.ReadFile(filepath.Join(host, "secret"))
	report("read-host", err)
	report("write-host", os.WriteFile(filepath.Join(host, "planted"), []byte("x"), 0o644))
	if fd, err := unix.Open(share, unix.O_PATH|unix.O_DIRECTORY, 0); err == nil {
		_, err = unix.Openat(fd, "../host/secret", unix.O_RDONLY, 0)
		report("dotdot-host", err)
		report("dotdot-chown", unix.Fchownat(fd, "../host/secret", 65534, 65534, 0))
	}
	report("chmod-host", unix.Chmod(filepath.Join(host, "secret"), 0o666))
	// The template's memory a clone maps, opened as QEMU 7.2 does.
	fd, err := unix.Open(memory, unix.O_RDWR, 0)
	report("memory-open", err)
	if err == nil {
		fl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		fmt.Fprintln(&out, "memory-accmode", fl&unix.O_ACCMODE)
		_, err = unix.Pwrite(fd, []byte("guest"), 0)
		report("memory-write", err)
		report("memory-fchmod", unix.Fchmod(fd, 0o666))
	}
	report("memory-chmod", unix.Chmod(memory, 0o666))
	// Its VM's own records.
	report("write-dir", os.WriteFile(filepath.Join(dir, "state.json"), []byte("{}"), 0o644))
	_, err = os.ReadFile(filepath.Join(dir, "record"))
	report("read-dir", err)
	// The shim.
	_, err = os.ReadFile(fmt.Sprintf("/proc/%d/environ", os.Getppid()))
	report("shim-environ", err)
	_, err = os.Open(fmt.Sprintf("/proc/%d/mem", os.Getppid()))
	report("shim-mem", err)
	report("shim-signal", unix.Kill(os.Getppid(), 0))
	fmt.Fprintln(&out, "uid", os.Getuid())
	// Its capabilities (it cannot read its own /proc/self/status).
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err == nil {
		fmt.Fprintf(&out, "capeff %016x\n", uint64(data[1].Effective)<<32|uint64(data[0].Effective))
	}
	if err := os.WriteFile(filepath.Join(share, "results"), []byte(out.String()), 0o644); err != nil {
		return 1
	}
	return 0
}

// A QEMU that the guest took over reaches its share and nothing else of
// the host's: not the files beside its VM (however it names them, nor
// their owners and modes), not its VM's records, not the shim that
// started it; its template's memory, a clone's, only for reading. The
// test binary is started in QEMU's place, by Start, with QEMU's
// arguments.
func TestFallenQEMUConfinedToItsVM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root test")
	}
	root := t.TempDir()
	dir, share, host := filepath.Join(root, "vm"), filepath.Join(root, "share"), filepath.Join(root, "host")
	for _, d := range []string{dir, share, host} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(host, "secret"), filepath.Join(dir, "record"), filepath.Join(root, "kernel")} {
		if err := os.WriteFile(f, []byte("host"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	memory := filepath.Join(root, "template.mem")
	if err := os.WriteFile(memory, []byte("template"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(memory, 128<<20); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	q, err := New(vm.Config{
		ID: "fallen", Dir: dir, Binary: self, VCPUs: 1, MemoryMiB: 128, Kernel: filepath.Join(root, "kernel"),
		Shares: []vm.Share{{Tag: "share", HostPath: share}}, Memory: &vm.MemoryFile{Path: memory},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := q.Start(ctx); err == nil {
		t.Fatal("Start of a QEMU that never answers QMP succeeded")
	}
	<-q.Done()
	b, err := os.ReadFile(filepath.Join(share, "results"))
	if err != nil {
		t.Fatalf("the fallen QEMU left no results: %v", err)
	}
	// Its root holds its own files alone: the host's others are not
	// there to name (Landlock would refuse reading and writing them, not
	// their owners and modes), nor, in its /proc, other users' processes.
	noent := "no such file or directory"
	var st unix.Stat_t
	testenv.CheckOutcomes(t, testenv.ParseOutcomes(string(b)), map[string]string{
		"share-write": "ok", "qmp-socket": "ok", "socket": "operation not permitted",
		"read-host": noent, "write-host": noent, "dotdot-host": noent, "dotdot-chown": noent, "chmod-host": noent,
		"write-dir": "read-only file system", "read-dir": noent,
		"shim-environ": noent, "shim-mem": noent, "shim-signal": "operation not permitted",
		"capeff": fmt.Sprintf("%016x", fsguard.KeptMask()), "uid": fmt.Sprint(UID("fallen")),
		"memory-open": "ok", "memory-accmode": "0", "memory-write": "bad file descriptor",
		"memory-fchmod": "read-only file system", "memory-chmod": "read-only file system",
	})
	if b, err := os.ReadFile(memory); err != nil || !strings.HasPrefix(string(b), "template") {
		t.Errorf("the template's memory after the fallen clone starts %q (%v)", b[:min(len(b), 8)], err)
	}
	if err := unix.Stat(memory, &st); err != nil || st.Mode&0o7777 != 0o600 {
		t.Errorf("the template's memory after the fallen clone: mode %o (%v); want 600", st.Mode&0o7777, err)
	}
	if _, err := os.Lstat(filepath.Join(host, "planted")); err == nil {
		t.Error("the fallen QEMU planted a file beside its VM")
	}
	if err := unix.Stat(filepath.Join(host, "secret"), &st); err != nil || st.Mode&0o7777 != 0o600 || st.Uid != 0 {
		t.Errorf("the host's file after the fallen QEMU: mode %o, uid %d (%v); want 600, 0", st.Mode&0o7777, st.Uid, err)
	}
}
