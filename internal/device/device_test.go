package device

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/hull-runtime/hull/internal/state"

	"github.com/hull-runtime/hull/internal/testenv"
)

type recorder struct{ rs []state.Resource }

func (r *recorder) Record(res state.Resource) error { r.rs = append(r.rs, res); return nil }

func specWith(devs ...specs.LinuxDevice) *specs.Spec {
	return &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{Devices: devs}}
}

func TestResolveCharDevices(t *testing.T) {
	rec := &recorder{}
	set, err := Resolve(specWith(
		specs.LinuxDevice{Path: "/dev/null", Type: "c", Major: 1, Minor: 3},
		specs.LinuxDevice{Path: "/dev/zero", Type: "c", Major: 1, Minor: 5},
	), Options{Container: "c1", Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Devices) != 2 || len(rec.rs) != 2 || Held() != 2 {
		t.Fatalf("devices %d, records %d, held %d", len(set.Devices), len(rec.rs), Held())
	}
	if rec.rs[0].Kind != state.KindFD || rec.rs[0].Container != "c1" || rec.rs[0].Key != set.Devices[0].Key {
		t.Errorf("record %+v", rec.rs[0])
	}
	for _, r := range rec.rs {
		if err := releaseFD(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	if Held() != 0 {
		t.Errorf("held %d after release", Held())
	}
	if _, err := set.Devices[0].File.Stat(); err == nil {
		t.Error("descriptor still open after release")
	}
}

func TestResolveErrorsNameTheDevice(t *testing.T) {
	for _, tc := range []struct {
		dev  specs.LinuxDevice
		want string
		is   error
	}{
		{specs.LinuxDevice{Path: "/dev/dm-102", Type: "b", Major: 253, Minor: 102}, "host device /dev/dm-102 (253:102): no such file", ErrNotFound},
		{specs.LinuxDevice{Path: "/dev/xvdq", Type: "b", Major: 7, Minor: 1 << 19}, "host device /dev/xvdq (7:524288): no such file", ErrNotFound},
		{specs.LinuxDevice{Path: "/dev/null", Type: "p"}, `host device /dev/null (0:0): type "p"`, ErrUnsupported},
	} {
		rec := &recorder{}
		// The first device is fine: its descriptor must be closed when the
		// second fails.
		_, err := Resolve(specWith(specs.LinuxDevice{Path: "/dev/zero", Type: "c", Major: 1, Minor: 5}, tc.dev),
			Options{Container: "c", Recorder: rec})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.is) {
			t.Errorf("%s: error %v, want %q (%v)", tc.dev.Path, err, tc.want, tc.is)
		}
		if Held() != 0 {
			t.Errorf("%s: %d descriptors held after a failed resolve", tc.dev.Path, Held())
		}
		if len(rec.rs) != 2 {
			t.Errorf("%s: %d records, want both (recorded before opening)", tc.dev.Path, len(rec.rs))
		}
	}
}

func TestOpenChecksTheNode(t *testing.T) {
	for _, tc := range []struct {
		dev  specs.LinuxDevice
		want string
	}{
		{specs.LinuxDevice{Path: "/dev/null", Type: "c", Major: 1, Minor: 5}, "host device /dev/null is 1:3, spec says 1:5"},
		{specs.LinuxDevice{Path: "/dev/null", Type: "b", Major: 1, Minor: 3}, "host device /dev/null is a character device, spec says a block device"},
		{specs.LinuxDevice{Path: "/dev/dm-102", Type: "b", Major: 253, Minor: 102}, "host device /dev/dm-102 (253:102): no such file"},
	} {
		if f, err := Open(tc.dev, false); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.dev.Path, err, tc.want)
			if f != nil {
				f.Close()
			}
		}
	}
}

func TestHostPathBySysfs(t *testing.T) {
	// The container path does not matter: /dev/zero is 1:5 on the host.
	f, err := OpenHost(specs.LinuxDevice{Path: "/dev/anything", Type: "c", Major: 1, Minor: 5}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Name() != "/dev/zero" {
		t.Errorf("host node %s, want /dev/zero", f.Name())
	}
}

func TestPrivileged(t *testing.T) {
	priv := specWith(specs.LinuxDevice{Path: "/dev/dm-9", Type: "b", Major: 253, Minor: 9})
	priv.Process.Capabilities = &specs.LinuxCapabilities{Bounding: []string{"CAP_SYS_ADMIN"}}
	set, err := Resolve(priv, Options{Container: "p"})
	if err != nil || len(set.Devices) != 0 || set.Dropped != 1 {
		t.Fatalf("privileged, host devices off: %+v %v", set, err)
	}
	// On: a vanished device is skipped, not fatal.
	set, err = Resolve(priv, Options{Container: "p", PrivilegedHostDevices: true})
	if err != nil || len(set.Devices) != 0 || len(set.Skipped) != 1 || !errors.Is(set.Skipped[0], ErrNotFound) {
		t.Fatalf("privileged, host devices on: %+v %v", set, err)
	}
	priv.Linux.MaskedPaths = []string{"/proc/kcore"}
	if Privileged(priv) {
		t.Error("a spec with masked paths counted as privileged")
	}
}

func TestReadOnlyFromRules(t *testing.T) {
	maj, mnr := int64(7), int64(3)
	d := specs.LinuxDevice{Type: "b", Major: 7, Minor: 3}
	deny := specs.LinuxDeviceCgroup{Allow: false, Access: "rwm"}
	if readOnly(d, []specs.LinuxDeviceCgroup{deny, {Allow: true, Type: "b", Major: &maj, Minor: &mnr, Access: "rm"}}) != true {
		t.Error("rm rule: want read-only")
	}
	if readOnly(d, []specs.LinuxDeviceCgroup{deny, {Allow: true, Type: "b", Major: &maj, Minor: &mnr, Access: "rwm"}}) {
		t.Error("rwm rule: want read-write")
	}
	if readOnly(d, nil) {
		t.Error("no rules: want read-write")
	}
}

// losetup attaches a loop device to a new file of size bytes and
// returns its path; the device is detached at cleanup.
func losetup(t *testing.T, size int64) string {
	t.Helper()
	testenv.Require(t, testenv.Root("loop devices"))
	file := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(file, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-f", "--show", file).CombinedOutput()
	if err != nil {
		t.Skipf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	return dev
}

func TestRootLoopDevice(t *testing.T) {
	dev := losetup(t, 1<<20)
	st := loopSpec(t, dev)
	set, err := Resolve(specWith(st), Options{Container: "c"})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	size, err := Size(set.Devices[0].File)
	if err != nil || size != 1<<20 {
		t.Fatalf("size %d, %v", size, err)
	}
	// Detached after opening: the descriptor still names the device, whose
	// size is now 0 (what AddDisk refuses).
	if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup -d: %v %s", err, out)
	}
	// A device number the host does not have fails naming it.
	bad := st
	bad.Minor = 1 << 19
	if _, err := Resolve(specWith(bad), Options{Container: "c"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("wrong minor: %v", err)
	}
}

func loopSpec(t *testing.T, dev string) specs.LinuxDevice {
	t.Helper()
	var maj, mnr int64
	b, err := os.ReadFile(filepath.Join("/sys/class/block", filepath.Base(dev), "dev"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmtSscan(strings.TrimSpace(string(b)), &maj, &mnr); err != nil {
		t.Fatal(err)
	}
	return specs.LinuxDevice{Path: dev, Type: "b", Major: maj, Minor: mnr}
}

func TestRootReleaseLoop(t *testing.T) {
	dev := losetup(t, 4096)
	file, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	r := state.Resource{Kind: state.KindLoopDev, Key: dev, Path: dev, Data: map[string]string{"backing": strings.TrimSpace(string(file))}}
	if err := releaseLoop(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file")); err == nil {
		t.Error("loop device still attached")
	}
	if err := releaseLoop(context.Background(), r); err != nil {
		t.Errorf("second release: %v", err)
	}
}

func fmtSscan(s string, maj, mnr *int64) (int, error) { return fmt.Sscanf(s, "%d:%d", maj, mnr) }
