package template

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/agentclient"
	"github.com/hull-runtime/hull/internal/testenv"
	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu"
)

// The package's tests leave no goroutine running and no descriptor open;
// QEMU's spawner thread lives as long as the process.
func TestMain(m *testing.M) { os.Exit(testenv.RunCheckingLeaks(m, "internal/vm/qemu.spawner")) }

// testShape is a shape of the test kernel and initrd (the agent's).
func testShape(t *testing.T) Shape {
	t.Helper()
	env, why := testenv.Env("HULL_TEST_KERNEL", "HULL_TEST_INITRD")
	testenv.Require(t, testenv.Root("QEMU and its files"), testenv.Bins("qemu-system-x86_64"), why)
	q, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatal(err)
	}
	fw := ""
	if _, err := os.Stat(qemu.QbootPath); err == nil {
		fw = qemu.QbootPath
	}
	return Shape{
		QEMU: q, Kernel: env[0], Initrd: env[1], Firmware: fw,
		MachineType: qemu.MachineQ35, Accel: "auto", VCPUs: 1, MemoryMiB: 256,
		ShareTags: []string{"hullshared"},
	}
}

// restore starts a VM restored from c in a directory of its own, stopped
// at the test's end. It does not fail t: concurrent tests call it.
func restore(t *testing.T, shape Shape, c *Clone) (*qemu.QEMU, error) {
	dir := shortDir(t)
	share := filepath.Join(dir, "shared")
	if err := os.Mkdir(share, 0o700); err != nil {
		return nil, err
	}
	q, err := qemu.New(vm.Config{
		ID: "clone", Dir: dir, Binary: shape.QEMU, MachineType: shape.MachineType, Firmware: shape.Firmware,
		VCPUs: shape.VCPUs, MemoryMiB: shape.MemoryMiB, Kernel: shape.Kernel, Initrd: shape.Initrd,
		KernelParams: shape.KernelParams, Accel: shape.Accel,
		Shares:  []vm.Share{{Tag: "hullshared", HostPath: share}},
		Memory:  &vm.MemoryFile{Path: c.MemoryPath},
		Restore: c.State,
	}, nil)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = q.Start(ctx)
	c.State.Close()
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		q.Stop(sctx, time.Second)
	})
	if err != nil {
		return nil, fmt.Errorf("restoring a clone: %w", err)
	}
	return q, nil
}

// clone restores a VM from c in a directory of its own and dials its
// agent. It returns the agent's Ping answer and how long it took.
func clone(t *testing.T, shape Shape, c *Clone) (*agentclient.Client, string, time.Duration) {
	t.Helper()
	start := time.Now()
	q, err := restore(t, shape, c)
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	t.Logf("clone restored (QEMU exec to guest running) in %v", started.Sub(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, ping, err := agentclient.DialWatching(ctx, q.AgentSocket(), q.Done(), q.WatchAgentPort, func(n int, err error) {
		t.Logf("connecting to the clone's agent again after connection %d: %v", n, err)
	})
	if err != nil {
		t.Fatalf("clone's agent: %v", vm.WithConsole(err, q.ConsoleTail(20)))
	}
	t.Cleanup(func() { client.Close() })
	t.Logf("clone's agent answered (Ping, clock measured) %v after the guest resumed", time.Since(started).Round(time.Millisecond))
	return client, ping.BootId, time.Since(start)
}

// TestCloneRestoresWithFreshIdentity: a template is built once; two
// clones restored from it answer, and their boot ids, /dev/urandom and
// random uuids differ (the Ping's entropy reseeded each one).
func TestCloneRestoresWithFreshIdentity(t *testing.T) {
	shape := testShape(t)
	s := NewStore(shortDir(t), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	begin := time.Now()
	c1, err := s.Get(ctx, shape)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("template built in %v", time.Since(begin).Round(time.Millisecond))
	c2, err := s.Get(ctx, shape)
	if err != nil {
		t.Fatal(err)
	}
	if c1.Key != c2.Key || c1.MemoryPath != c2.MemoryPath {
		t.Fatalf("second Get made another template: %s vs %s", c1.Key, c2.Key)
	}
	_, boot1, d1 := clone(t, shape, c1)
	_, boot2, d2 := clone(t, shape, c2)
	t.Logf("clones answering after %v and %v", d1.Round(time.Millisecond), d2.Round(time.Millisecond))
	if boot1 == "" || boot1 == boot2 {
		t.Errorf("clones' boot ids %q and %q: want two different ids", boot1, boot2)
	}
}

// clockTolerance is how far a clone's clock may be from the host's beyond
// what the measure can tell: the host's correction is itself within half
// its best probe's round trip.
const clockTolerance = 25 * time.Millisecond

// TestCloneClockIsTheHosts: a clone's wall clock is the host's, not late by
// the first Ping's trip into a guest that was just restored (≈ 0.1–0.2 s
// under TCG, which a step to the request's time leaves it behind).
func TestCloneClockIsTheHosts(t *testing.T) {
	shape := testShape(t)
	s := NewStore(shortDir(t), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := s.Get(ctx, shape)
	if err != nil {
		t.Fatal(err)
	}
	client, _, _ := clone(t, shape, c)
	m, err := agentclient.MeasureClock(ctx, client, 5)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("clone's clock %v off the host's (±%v)", m.Offset, m.RTT/2)
	if m.Offset.Abs() > m.RTT/2+clockTolerance {
		t.Errorf("clone's clock is %v off the host's (measured ±%v), want within %v", m.Offset, m.RTT/2, clockTolerance)
	}
}

// TestBuildersRaceBuildOnce: concurrent Gets build one template.
func TestBuildersRaceBuildOnce(t *testing.T) {
	shape := testShape(t)
	s := NewStore(shortDir(t), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	keys := make([]string, 3)
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := s.Get(ctx, shape)
			if err != nil {
				t.Error(err)
				return
			}
			c.State.Close()
			keys[i] = c.Key
		}()
	}
	wg.Wait()
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].Key != keys[0] || keys[1] != keys[0] || keys[2] != keys[0] {
		t.Fatalf("after 3 racing Gets: templates %+v (%v), keys %v; want one", list, err, keys)
	}
	if list[0].Stale || list[0].Err != nil || list[0].Meta.StateSHA256 == "" {
		t.Errorf("the template is not usable: %+v", list[0])
	}
}

// shortDir is a temporary directory with a path short enough for the
// sockets under a template's build directory.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "hullt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// TestFailedBuildLeavesNothing: a guest whose agent dies at start (the
// agent-fatal failpoint, passed on the kernel command line) makes Get
// fail naming the template, and leaves no template, build or held lock.
func TestFailedBuildLeavesNothing(t *testing.T) {
	shape := testShape(t)
	shape.KernelParams = []string{"hull_failpoint=agent-fatal"}
	s := NewStore(shortDir(t), nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key, err := shape.Key()
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Get(ctx, shape)
	if err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "stopped before its agent was ready") {
		t.Fatalf("Get with a dying agent: %v; want an error naming template %s and why", err, key)
	}
	ents, _ := os.ReadDir(s.Dir)
	for _, e := range ents {
		if e.Name() != key+".lock" {
			t.Errorf("left after a failed build: %s", e.Name())
		}
	}
	if list, _ := s.List(); len(list) != 0 {
		t.Errorf("templates after a failed build: %+v", list)
	}
}
