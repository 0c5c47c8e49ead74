package harness

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRI is a CRI v1 client of a harness containerd, as kubelet uses it.
type CRI struct {
	runtime.RuntimeServiceClient
	runtime.ImageServiceClient
	conn *grpc.ClientConn
	// netnsPath is containerd's network namespace, where its streaming
	// server listens on 127.0.0.1.
	netnsPath string
}

// Dial connects to c's CRI socket.
func Dial(c *Containerd) (*CRI, error) {
	conn, err := grpc.NewClient("unix://"+c.Socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return nil, fmt.Errorf("dialling %s: %w", c.Socket, err)
	}
	return &CRI{
		RuntimeServiceClient: runtime.NewRuntimeServiceClient(conn),
		ImageServiceClient:   runtime.NewImageServiceClient(conn),
		conn:                 conn,
		netnsPath:            c.NetnsPath,
	}, nil
}

// Close closes the connection.
func (c *CRI) Close() error { return c.conn.Close() }

// Version asks for the runtime's version.
func (c *CRI) Version(ctx context.Context) (*runtime.VersionResponse, error) {
	return c.RuntimeServiceClient.Version(ctx, &runtime.VersionRequest{Version: "v1"})
}

// Pod is a pod sandbox created through RunPod.
type Pod struct {
	ID      string
	Config  *runtime.PodSandboxConfig
	Handler string
	LogDir  string
}

// RunPod runs a pod sandbox named name with the runtime handler, its
// container logs under logDir.
func (c *CRI) RunPod(ctx context.Context, name, handler, logDir string) (*Pod, error) {
	cfg := podConfig(name, logDir)
	resp, err := c.RunPodSandbox(ctx, &runtime.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		return nil, err
	}
	return &Pod{ID: resp.PodSandboxId, Config: cfg, Handler: handler, LogDir: logDir}, nil
}

// podConfig is the sandbox configuration of a pod named name.
func podConfig(name, logDir string) *runtime.PodSandboxConfig {
	return &runtime.PodSandboxConfig{
		Metadata: &runtime.PodSandboxMetadata{
			Name: name, Uid: name + "-uid", Namespace: "hull-e2e", Attempt: 0,
		},
		Hostname:     name,
		LogDirectory: logDir,
		Labels:       map[string]string{"hull-e2e": "true"},
		Linux: &runtime.LinuxPodSandboxConfig{
			SecurityContext: &runtime.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtime.NamespaceOption{
					Network: runtime.NamespaceMode_POD,
					Pid:     runtime.NamespaceMode_CONTAINER,
					Ipc:     runtime.NamespaceMode_POD,
				},
			},
		},
	}
}

// PodState returns the pod's state.
func (c *CRI) PodState(ctx context.Context, pod *Pod) (runtime.PodSandboxState, error) {
	st, err := c.PodSandboxStatus(ctx, &runtime.PodSandboxStatusRequest{PodSandboxId: pod.ID})
	if err != nil {
		return 0, err
	}
	return st.Status.State, nil
}

// Container describes a container to create.
type Container struct {
	Name    string
	Image   string // default BusyboxImage
	Command []string
	Args    []string
	Env     map[string]string
	// LogPath is relative to the pod's log directory (default
	// Name.log).
	LogPath string
	Tty     bool
	// Annotations of the container (containerd passes those listed in
	// the handler's container_annotations to the runtime).
	Annotations map[string]string
	// Privileged needs a privileged pod (PodOptions.Privileged).
	Privileged bool
}

// CreateContainer creates a container in pod and returns its id.
func (c *CRI) CreateContainer(ctx context.Context, pod *Pod, ct Container) (string, error) {
	if ct.Image == "" {
		ct.Image = BusyboxImage
	}
	if ct.LogPath == "" {
		ct.LogPath = ct.Name + ".log"
	}
	var envs []*runtime.KeyValue
	for k, v := range ct.Env {
		envs = append(envs, &runtime.KeyValue{Key: k, Value: []byte(v)})
	}
	// kubelet gives every container the pod's namespace options (its own
	// pid namespace unless the pod shares one).
	linux := &runtime.LinuxContainerConfig{SecurityContext: &runtime.LinuxContainerSecurityContext{
		NamespaceOptions: pod.Config.GetLinux().GetSecurityContext().GetNamespaceOptions(),
		Privileged:       ct.Privileged,
	}}
	resp, err := c.RuntimeServiceClient.CreateContainer(ctx, &runtime.CreateContainerRequest{
		PodSandboxId: pod.ID,
		Config: &runtime.ContainerConfig{
			Metadata:    &runtime.ContainerMetadata{Name: ct.Name},
			Image:       &runtime.ImageSpec{Image: ct.Image},
			Command:     ct.Command,
			Args:        ct.Args,
			Envs:        envs,
			LogPath:     ct.LogPath,
			Tty:         ct.Tty,
			Linux:       linux,
			Annotations: ct.Annotations,
		},
		SandboxConfig: pod.Config,
	})
	if err != nil {
		return "", err
	}
	return resp.ContainerId, nil
}

// StartNew creates and starts a container and returns its id.
func (c *CRI) StartNew(ctx context.Context, pod *Pod, ct Container) (string, error) {
	id, err := c.CreateContainer(ctx, pod, ct)
	if err != nil {
		return "", fmt.Errorf("creating container %s: %w", ct.Name, err)
	}
	if _, err := c.StartContainer(ctx, &runtime.StartContainerRequest{ContainerId: id}); err != nil {
		return id, fmt.Errorf("starting container %s: %w", ct.Name, err)
	}
	return id, nil
}

// Status returns a container's status.
func (c *CRI) Status(ctx context.Context, id string) (*runtime.ContainerStatus, error) {
	resp, err := c.ContainerStatus(ctx, &runtime.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return nil, err
	}
	return resp.Status, nil
}

// WaitState polls (4 times a second) until the container is in state,
// or ctx ends.
func (c *CRI) WaitState(ctx context.Context, id string, state runtime.ContainerState) (*runtime.ContainerStatus, error) {
	var last *runtime.ContainerStatus
	for {
		st, err := c.Status(ctx, id)
		if err == nil {
			last = st
			if st.State == state {
				return st, nil
			}
			if st.State == runtime.ContainerState_CONTAINER_EXITED && state != runtime.ContainerState_CONTAINER_EXITED {
				return st, fmt.Errorf("container %s exited (code %d, reason %q, message %q) instead of reaching %s",
					id, st.ExitCode, st.Reason, st.Message, state)
			}
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return last, fmt.Errorf("container %s still %s, not %s: %w", id, last.State, state, ctx.Err())
			}
			return nil, fmt.Errorf("container %s: no status (%v): %w", id, err, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// WaitExited waits until the container has exited and returns its status.
func (c *CRI) WaitExited(ctx context.Context, id string) (*runtime.ContainerStatus, error) {
	return c.WaitState(ctx, id, runtime.ContainerState_CONTAINER_EXITED)
}

// Exec runs cmd in a container through ExecSync.
func (c *CRI) Exec(ctx context.Context, id string, timeout time.Duration, cmd ...string) (stdout, stderr string, code int32, err error) {
	resp, err := c.ExecSync(ctx, &runtime.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: int64(timeout / time.Second)})
	if err != nil {
		return "", "", -1, err
	}
	return string(resp.Stdout), string(resp.Stderr), resp.ExitCode, nil
}

// RemovePod stops and removes a pod; a pod that is gone already is fine.
func (c *CRI) RemovePod(ctx context.Context, id string) error {
	if _, err := c.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		if status.Code(err) == codes.NotFound {
			return nil
		}
		return fmt.Errorf("StopPodSandbox %s: %w", id, err)
	}
	for {
		_, err := c.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: id})
		if err == nil || status.Code(err) == codes.NotFound {
			return nil
		}
		if !rootDirRace(err) {
			return fmt.Errorf("RemovePodSandbox %s: %w", id, err)
		}
		// kubelet's next sync removes the pod again; so does the harness.
		select {
		case <-ctx.Done():
			return fmt.Errorf("RemovePodSandbox %s: %w (%w)", id, err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// rootDirRace reports containerd 1.7's own race: a TaskOOM event handled
// late rewrites the container's status file into its root directory while
// RemoveContainer deletes that directory (a runtime that reports many OOM
// events, as runc's shim does, meets it). A second removal finds the
// directory whole and removes it.
func rootDirRace(err error) bool {
	msg := status.Convert(err).Message()
	return strings.Contains(msg, "failed to remove container root directory") &&
		strings.Contains(msg, "directory not empty")
}

// PodContainers lists the ids of a pod's containers.
func (c *CRI) PodContainers(ctx context.Context, podID string) ([]string, error) {
	resp, err := c.ListContainers(ctx, &runtime.ListContainersRequest{
		Filter: &runtime.ContainerFilter{PodSandboxId: podID}})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, ct := range resp.Containers {
		ids = append(ids, ct.Id)
	}
	return ids, nil
}

// LogLine is one line of a CRI container log.
type LogLine struct {
	Time   time.Time
	Stream string // "stdout" or "stderr"
	Text   string
}

// ReadLog parses a CRI container log file (`<RFC3339Nano> <stream>
// <P|F> <text>` per line; P lines are partial and join the next).
func ReadLog(file string) ([]LogLine, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []LogLine
	partial := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 4)
		if len(f) < 3 {
			return out, fmt.Errorf("%s: malformed CRI log line %q", file, sc.Text())
		}
		ts, err := time.Parse(time.RFC3339Nano, f[0])
		if err != nil {
			return out, fmt.Errorf("%s: bad time in %q: %w", file, sc.Text(), err)
		}
		text := ""
		if len(f) == 4 {
			text = f[3]
		}
		if f[2] == "P" {
			partial[f[1]] += text
			continue
		}
		out = append(out, LogLine{Time: ts, Stream: f[1], Text: partial[f[1]] + text})
		delete(partial, f[1])
	}
	return out, sc.Err()
}

// LogText is the lines of a stream ("stdout", "stderr", "" for both) of a
// CRI log file, joined with newlines.
func LogText(file, stream string) (string, error) {
	lines, err := ReadLog(file)
	var b strings.Builder
	for _, l := range lines {
		if stream == "" || l.Stream == stream {
			b.WriteString(l.Text + "\n")
		}
	}
	return b.String(), err
}

// LogFile is the path of a container's log in pod's log directory.
func LogFile(pod *Pod, ct Container) string {
	if ct.LogPath == "" {
		ct.LogPath = ct.Name + ".log"
	}
	return filepath.Join(pod.LogDir, ct.LogPath)
}
