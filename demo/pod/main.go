// Command pod is the second half of `make demo`: it starts a private
// containerd (its own root, state, socket and network namespace) with
// Hull as the runtime handler "hull", runs a pod with two containers
// through CRI as kubelet would, shows their output and an exec, removes
// the pod and shows that nothing of it is left.
//
// It uses the installed Hull (`make install`): containerd-shim-hull-v2
// from /usr/local/bin and the guest image from /usr/share/hull.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

func main() {
	shimDir := flag.String("shim-dir", "/usr/local/bin", "directory holding containerd-shim-hull-v2")
	kernel := flag.String("kernel", config.DefaultKernel, "guest kernel")
	initrd := flag.String("initrd", config.DefaultInitrd, "guest initramfs")
	flag.Parse()
	if err := run(*shimDir, *kernel, *initrd); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func say(format string, a ...any) {
	fmt.Printf("\n\033[1m== "+format+"\033[0m\n", a...)
}

func run(shimDir, kernel, initrd string) (err error) {
	if _, err := os.Stat(filepath.Join(shimDir, "containerd-shim-hull-v2")); err != nil {
		return fmt.Errorf("no shim in %s (run make install): %w", shimDir, err)
	}
	dir, err := os.MkdirTemp("", "hull-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := filepath.Join(dir, "hull.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("[hypervisor.qemu]\nkernel = %q\ninitrd = %q\n", kernel, initrd)), 0o644); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	say("starting a private containerd (runtime handler %q = io.containerd.hull.v2) in its own network namespace", harness.HandlerHull)
	ctd, cri, err := harness.Launch(ctx, harness.Options{Dir: filepath.Join(dir, "ctd"), ShimDir: shimDir, HullConfig: cfg})
	if err != nil {
		return err
	}
	defer func() {
		for _, e := range ctd.Close() {
			fmt.Fprintln(os.Stderr, "demo: left behind:", e)
			err = fmt.Errorf("the demo left something behind")
		}
	}()
	defer cri.Close()
	if v, err := cri.Version(ctx); err == nil {
		fmt.Printf("CRI: %s %s\n", v.RuntimeName, v.RuntimeVersion)
	}

	say("RunPodSandbox with runtimeClassName hull: the pod gets its own VM")
	logDir := filepath.Join(dir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	t0 := time.Now()
	pod, err := cri.RunPod(ctx, "demo", harness.HandlerHull, logDir)
	if err != nil {
		return fmt.Errorf("RunPodSandbox: %w", err)
	}
	fmt.Printf("pod %.12s ready in %v\n", pod.ID, time.Since(t0).Round(time.Millisecond))
	if q, ok := ctd.PodQEMU(pod.ID); ok {
		fmt.Printf("its VM: QEMU pid %d\n", q.Pid)
	}

	say("two containers in the pod: same VM, separate filesystems")
	show := `echo "I am $0 in $(hostname), guest kernel $(uname -r), boot id $(cat /proc/sys/kernel/random/boot_id)"; echo "mine" > /tmp/owner; sleep 3600`
	var ids []string
	for _, name := range []string{"one", "two"} {
		id, err := cri.StartNew(ctx, pod, harness.Container{Name: name, Command: []string{"sh", "-c", show, name}})
		if err != nil {
			return err
		}
		ids = append(ids, id)
	}
	for _, name := range []string{"one", "two"} {
		text, err := waitLog(ctx, filepath.Join(logDir, name+".log"))
		if err != nil {
			return err
		}
		fmt.Printf("%s's CRI log: %s", name, text)
	}

	say("ExecSync into container one")
	out, _, code, err := cri.Exec(ctx, ids[0], 30*time.Second, "sh", "-c", "echo exec sees: $(ls /tmp); ps -o pid,comm | head -5; exit 4")
	if err != nil {
		return fmt.Errorf("ExecSync: %w", err)
	}
	fmt.Printf("%sexit code %d\n", out, code)

	say("StopPodSandbox + RemovePodSandbox")
	t1 := time.Now()
	if err := cri.RemovePod(ctx, pod.ID); err != nil {
		return err
	}
	fmt.Printf("removed in %v\n", time.Since(t1).Round(time.Millisecond))

	say("what is left of the pod: shim, QEMU, mounts, /run/hull/<id>, sockets, netns")
	leftovers := ctd.Residue(5*time.Second, append([]string{pod.ID}, ids...))
	if len(leftovers) == 0 {
		fmt.Println("nothing")
	}
	for _, l := range leftovers {
		fmt.Println("LEFT:", l)
	}
	if _, err := os.Stat(filepath.Join(config.DefaultRunDir, pod.ID)); err == nil {
		leftovers = append(leftovers, fmt.Errorf("%s/%s", config.DefaultRunDir, pod.ID))
	}
	if len(leftovers) > 0 {
		return fmt.Errorf("%d things left behind", len(leftovers))
	}
	return nil
}

// waitLog waits for the first line of a container's CRI log.
func waitLog(ctx context.Context, file string) (string, error) {
	for {
		text, err := harness.LogText(file, "stdout")
		if err == nil && strings.TrimSpace(text) != "" {
			return text, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no output in %s: %w", file, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
