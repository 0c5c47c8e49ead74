package harness

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// LoggedIDs finds the ids of containerd 1.6.20's CRI debug log lines, a
// RunPodSandbox that failed before returning an id included.
func TestLoggedIDs(t *testing.T) {
	sb := "7eb57961010e49020a5f04e9af30b42fd420198056f3990daa33778e2188aea4"
	failed := "13efddf8890dd133d50a7464a19258baecb90dccc1300e23b59d93b913f56ed1"
	ct := "8992cb0b0eae747211755b29fa0fbe0367cd0f49b3dbf8fb81311446a860c645"
	log := `time="2026-11-29T21:06:10.970935251Z" level=debug msg="generated id for sandbox name \"p_ns_uid_0\"" podsandboxid=` + sb + `
time="2026-11-29T21:06:11.970935251Z" level=debug msg="generated id for sandbox name \"q_ns_uid_0\"" podsandboxid=` + failed + `
time="2026-11-29T21:06:11.180841007Z" level=info msg="TearDown network for sandbox \"` + sb + `\" successfully"
time="2026-11-29T21:06:12.1Z" level=debug msg="Generated id \"` + ct + `\" for container \"a\""
time="2026-11-29T21:06:12.2Z" level=debug msg="event published" ns=k8s.io topic=/snapshot/remove digest=sha256:4fde391641ce78e85f6e8642bd4c1103c5609e9334cf0a4dbe10c457b94d09a4
`
	c := &Containerd{LogFile: filepath.Join(t.TempDir(), "containerd.log")}
	if err := os.WriteFile(c.LogFile, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got := c.LoggedIDs()
	if want := []string{sb, failed, ct}; !slices.Equal(got, want) {
		t.Errorf("LoggedIDs = %v, want %v", got, want)
	}
}

func TestCPUTimeAndProcessGone(t *testing.T) {
	d, err := CPUTime(os.Getpid())
	if err != nil || d < 0 {
		t.Fatalf("CPUTime(self) = %v, %v", d, err)
	}
	if ProcessGone(os.Getpid()) {
		t.Errorf("ProcessGone(self) = true")
	}
	if _, err := WaitGone(os.Getpid(), 50*time.Millisecond); err == nil {
		t.Errorf("WaitGone(self) returned without an error")
	}
}

func TestPercentile(t *testing.T) {
	xs := []time.Duration{5, 1, 4, 2, 3}
	if p := Percentile(xs, 50); p != 3 {
		t.Errorf("p50 = %v, want 3", p)
	}
	if p := Percentile(xs, 95); p != 5 {
		t.Errorf("p95 = %v, want 5", p)
	}
	if p := Percentile([]int64(nil), 50); p != 0 {
		t.Errorf("p50 of nothing = %v, want 0", p)
	}
}
