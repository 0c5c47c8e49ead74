package harness

import (
	"context"
	"fmt"
	"time"
)

// launchTimeout bounds starting containerd, importing the test images
// and connecting to CRI.
const launchTimeout = 2 * time.Minute

// Launch prepares and starts a private containerd, imports the test
// images into namespaces (CRI's by default) and connects to its CRI. On
// error everything it started is undone.
func Launch(ctx context.Context, opts Options, namespaces ...string) (*Containerd, *CRI, error) {
	if len(namespaces) == 0 {
		namespaces = []string{CRINamespace}
	}
	ctd, err := New(opts)
	if err != nil {
		return nil, nil, fmt.Errorf("preparing containerd: %w", err)
	}
	cri, err := start(ctx, ctd, namespaces)
	if err != nil {
		ctd.Close()
		return nil, nil, err
	}
	return ctd, cri, nil
}

func start(ctx context.Context, ctd *Containerd, namespaces []string) (*CRI, error) {
	ctx, cancel := context.WithTimeout(ctx, launchTimeout)
	defer cancel()
	if err := ctd.Start(ctx); err != nil {
		return nil, err
	}
	if err := ctd.ImportTestImages(ctx, namespaces...); err != nil {
		return nil, err
	}
	return Dial(ctd)
}

// TB is what LaunchT needs of a test (testing.TB has it).
type TB interface {
	Helper()
	Cleanup(func())
	Failed() bool
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// LaunchT is Launch for a test: it fails the test on error, and at the
// test's end logs containerd's last logLines lines if the test failed,
// closes CRI, stops containerd, and fails the test for anything it left.
// extraLog, if set, is logged too when the test failed.
func LaunchT(t TB, opts Options, logLines int, extraLog func() string, namespaces ...string) (*Containerd, *CRI) {
	t.Helper()
	if len(namespaces) == 0 {
		namespaces = []string{CRINamespace}
	}
	ctd, err := New(opts)
	if err != nil {
		t.Fatalf("preparing containerd: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd log (last %d lines):\n%s", logLines, ctd.Log(logLines))
			if extraLog != nil {
				t.Logf("%s", extraLog())
			}
		}
		for _, err := range ctd.Close() {
			t.Errorf("leak: %v", err)
		}
	})
	cri, err := start(context.Background(), ctd, namespaces)
	if err != nil {
		t.Fatalf("starting containerd: %v", err)
	}
	t.Cleanup(func() { cri.Close() })
	return ctd, cri
}
