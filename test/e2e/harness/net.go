package harness

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	goruntime "runtime"
	"time"

	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// PodConfig is the sandbox configuration RunPod uses for a pod named
// name, for a test to amend (DNS, annotations) and pass to RunPodConfig.
func PodConfig(name, logDir string) *runtime.PodSandboxConfig { return podConfig(name, logDir) }

// RunPodConfig runs a pod sandbox with the configuration cfg.
func (c *CRI) RunPodConfig(ctx context.Context, cfg *runtime.PodSandboxConfig, handler string) (*Pod, error) {
	resp, err := c.RunPodSandbox(ctx, &runtime.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		return nil, err
	}
	return &Pod{ID: resp.PodSandboxId, Config: cfg, Handler: handler, LogDir: cfg.LogDirectory}, nil
}

// PodIP is the pod's primary IP address (PodSandboxStatus).
func (c *CRI) PodIP(ctx context.Context, podID string) (string, error) {
	st, err := c.PodSandboxStatus(ctx, &runtime.PodSandboxStatusRequest{PodSandboxId: podID})
	if err != nil {
		return "", err
	}
	if st.Status.GetNetwork().GetIp() == "" {
		return "", fmt.Errorf("pod %s has no IP in its status", podID)
	}
	return st.Status.Network.Ip, nil
}

// InNetns runs fn on a thread that has entered the network namespace at
// nsPath (a socket fn creates belongs to that namespace and keeps
// working anywhere afterwards). The thread returns to its namespace; one
// that cannot is discarded.
func InNetns(nsPath string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open(nsPath)
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		// nsenter --net=<nsPath>, for this thread only
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			goruntime.UnlockOSThread()
			errc <- fmt.Errorf("entering %s: %w", nsPath, err)
			return
		}
		err = fn()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			goruntime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// DialInNetns opens a TCP connection from inside the network namespace at
// nsPath.
func DialInNetns(ctx context.Context, nsPath, addr string) (net.Conn, error) {
	return dialInNetns(ctx, nsPath, addr)
}

// HTTPClientInNetns is an HTTP client whose connections start in the
// network namespace at nsPath (the harness's: Containerd.NetnsPath).
// keepAlive false opens a connection per request, as wget does.
func HTTPClientInNetns(nsPath string, keepAlive bool, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return dialInNetns(ctx, nsPath, addr)
			},
			DisableKeepAlives: !keepAlive,
			Proxy:             nil,
		},
	}
}
