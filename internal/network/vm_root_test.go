package network

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/agentclient"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu"

	"github.com/hull-runtime/hull/internal/testenv"
)

// TestTrafficReachesTheGuest boots a VM on each model's NIC, lets the
// agent apply SetupNetwork and pings the pod IP from the peer namespace:
// the guest kernel answers, so frames cross the plumbing both ways.
func TestTrafficReachesTheGuest(t *testing.T) {
	needRoot(t)
	assets, why := testenv.Env("HULL_TEST_KERNEL", "HULL_TEST_INITRD")
	testenv.Require(t, why, testenv.Bins("qemu-system-x86_64", "busybox"))
	kernel, initrd := assets[0], assets[1]
	for _, model := range []string{ModelTCFilter, ModelMacvtap} {
		t.Run(model, func(t *testing.T) {
			p := newPod(t)
			before := snapshot(t, p.ns)
			h := newHandle(t)
			ep, err := Setup(Options{Netns: nsPath(p.ns), Model: model, Recorder: h})
			if err != nil {
				t.Fatal(err)
			}
			defer ep.Close()
			// Short: the agent socket path must fit in sun_path.
			dir, err := os.MkdirTemp("", "hn")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(dir)
			hv, err := qemu.New(vm.Config{
				ID: "net-" + model, Dir: dir, VCPUs: 1, MemoryMiB: 128,
				Kernel: kernel, Initrd: initrd, Accel: "auto", NICs: ep.NICs,
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			if err := hv.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer hv.Stop(context.Background(), 2*time.Second)
			ep.Close() // QEMU holds its own copies
			c, _, err := agentclient.Dial(ctx, hv.AgentSocket(), hv.Done())
			if err != nil {
				con, _ := os.ReadFile(hv.ConsoleLog())
				t.Fatalf("agent: %v\n%s", err, con)
			}
			defer c.Close()
			if _, err := c.SetupNetwork(ctx, ep.Request); err != nil {
				t.Fatalf("SetupNetwork: %v", err)
			}
			out, err := exec.CommandContext(ctx, "ip", "netns", "exec", p.peer, "busybox", "ping", "-c", "3", "-W", "5", podIP).CombinedOutput()
			if err != nil || !strings.Contains(string(out), " 0% packet loss") {
				t.Fatalf("ping %s from the peer: %v\n%s", podIP, err, out)
			}
			t.Logf("%s", out)
			out, err = exec.CommandContext(ctx, "ip", "netns", "exec", p.peer, "busybox", "ping", "-6", "-c", "2", "-W", "5", podIP6).CombinedOutput()
			if err != nil || !strings.Contains(string(out), " 0% packet loss") {
				t.Errorf("ping %s from the peer: %v\n%s", podIP6, err, out)
			}

			if err := hv.Stop(ctx, 2*time.Second); err != nil {
				t.Error(err)
			}
			if err := state.Release(ctx, h, "", state.BuiltinReleasers().With(Releasers())); err != nil {
				t.Fatal(err)
			}
			// ARP/NDP entries the traffic made are the kernel's, not
			// Hull's: compare what CNI owns.
			run(t, "ip", "-n", p.ns, "neigh", "flush", "nud", "reachable", "nud", "stale", "nud", "delay", "nud", "probe")
			if after := snapshot(t, p.ns); after != before {
				t.Errorf("namespace changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}
