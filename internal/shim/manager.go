// Package shim is containerd-shim-hull-v2: the shim v2 process (start,
// delete, the server; run.go), and the task service that runs a pod's
// containers in the pod's VM.
//
// One shim process serves a whole pod: tasks are grouped by CRI's
// io.kubernetes.cri.sandbox-id annotation, and the shim's socket address
// is derived from that id, so `start` for a later container of the pod
// finds the running shim and returns its address.
package shim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/runtime/v2/shim"
	"github.com/containerd/log"

	"github.com/hull-runtime/hull/internal/sandbox"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/storage"
)

// RuntimeName is the runtime_type containerd is configured with.
const RuntimeName = "io.containerd.hull.v2"

type manager struct{}

func (manager) Name() string { return RuntimeName }

// Start runs in the bundle directory of task id. It returns the address
// of the pod's shim, starting the shim server when the pod has none yet.
// containerd reads stdout and stderr together: nothing else is printed.
func (manager) Start(ctx context.Context, id string, opts shim.StartOpts) (_ string, retErr error) {
	spec, err := readSpec(".")
	if err != nil {
		return "", err
	}
	group, _ := sandboxOf(id, spec.Annotations)
	address, err := shim.SocketAddress(ctx, opts.Address, group)
	if err != nil {
		return "", err
	}
	socket, err := shim.NewSocket(address)
	if err != nil {
		if !shim.SocketEaddrinuse(err) {
			return "", fmt.Errorf("creating shim socket: %w", err)
		}
		// A later container of a running pod.
		if shimServes(address) {
			if err := shim.WriteAddress("address", address); err != nil {
				return "", fmt.Errorf("writing address of the pod's shim: %w", err)
			}
			return address, nil
		}
		// A socket left by a dead shim.
		if err := shim.RemoveSocket(address); err != nil {
			return "", fmt.Errorf("removing stale shim socket: %w", err)
		}
		if socket, err = shim.NewSocket(address); err != nil {
			return "", fmt.Errorf("creating shim socket: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			socket.Close()
			_ = shim.RemoveSocket(address)
		}
	}()
	// containerd reconnects after its own restart through this file.
	if err := shim.WriteAddress("address", address); err != nil {
		return "", err
	}
	f, err := socket.File()
	if err != nil {
		return "", err
	}
	defer f.Close()
	cmd, err := serverCommand(ctx, id, opts)
	if err != nil {
		return "", err
	}
	cmd.ExtraFiles = []*os.File{f} // fd 3: the listening socket
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("starting the shim server: %w", err)
	}
	// The server outlives this process; reap it if it dies before we exit.
	go cmd.Wait()
	return address, nil
}

// serverCommand is the long-lived shim server: this binary without an
// action, in its own process group so signals to containerd's group do
// not reach it. QEMU is started from it, and dies with it.
func serverCommand(ctx context.Context, id string, opts shim.StartOpts) (*exec.Cmd, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	args := []string{"-namespace", ns, "-id", id, "-address", opts.Address}
	if opts.Debug {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = os.Environ()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, nil
}

// Stop is `shim delete`, run in the bundle directory of task id after the
// task's connection closed: for every task, also after a normal delete
// (then there is nothing left to do) and after the shim crashed. It
// releases, through the one release path, what the sandbox's state
// records for that task; for the sandbox task, the whole sandbox — QEMU
// included, if it somehow still runs — and, if the shim server that owns
// the sandbox still runs, it is killed first: containerd has given up on
// it, and it must not go on recording. Idempotent.
func (manager) Stop(ctx context.Context, id string) (shim.StopStatus, error) {
	bundle, err := os.Getwd()
	if err != nil {
		return shim.StopStatus{}, err
	}
	sid, isSandbox := id, true
	if spec, err := readSpec(bundle); err == nil {
		sid, isSandbox = sandboxOf(id, spec.Annotations)
	}
	logger := log.G(ctx).WithField("sandbox", sid).WithField("container", id)
	ctx, cancel := context.WithTimeout(ctx, deleteTimeout)
	defer cancel()
	var errs []error
	if root, err := readStateRoot(bundle); err != nil {
		errs = append(errs, err)
	} else if err := releaseTaskState(ctx, &state.Store{Root: root}, sid, id, isSandbox); err != nil {
		errs = append(errs, err)
	}
	// As runc's shim does: containerd's bundle never keeps a mount, even
	// one that a state file no longer names.
	if err := storage.Unmount(filepath.Join(bundle, "rootfs")); err != nil {
		errs = append(errs, err)
	}
	// The pod's shim socket, once no shim serves it (the shim was killed,
	// or has exited): a SIGKILLed shim cannot remove it itself.
	if address, err := shim.ReadAddress(filepath.Join(bundle, "address")); err == nil && !shimServes(address) {
		// The pod's other tasks race for it: gone is removed.
		if err := shim.RemoveSocket(address); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing shim socket %s: %w", address, err))
		}
	}
	if err := joinErrs(errs); err != nil {
		logger.WithError(err).Error("shim delete")
		return shim.StopStatus{}, err
	}
	return shim.StopStatus{ExitedAt: time.Now(), ExitStatus: int(exitVMLost)}, nil
}

// deleteTimeout bounds `shim delete`, waiting for the state lock included.
const deleteTimeout = 30 * time.Second

// releaseTaskState is `shim delete`'s release: task id's resources, or
// for the sandbox task the whole sandbox after its owner, if alive.
//
// The owner is stopped before the lock is taken: a shim in the middle of a
// Create holds the lock for the whole boot, and killing it drops the lock
// at once, so the wait for the lock is bounded by the owner's death, not
// by its boot (deleteTimeout bounds both).
func releaseTaskState(ctx context.Context, store *state.Store, sid, id string, isSandbox bool) error {
	if isSandbox {
		st, err := store.Peek(sid)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // released already
		}
		if err == nil {
			if err := stopOwner(ctx, sid, st); err != nil {
				return err
			}
		}
	}
	h, err := store.OpenContext(ctx, sid)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // released already
	}
	if err != nil {
		return err
	}
	defer h.Close()
	if !isSandbox {
		return sandbox.Release(ctx, h, id)
	}
	// The owner recorded under the lock (a state replaced since the peek).
	if err := stopOwner(ctx, sid, h.State()); err != nil {
		return err
	}
	return sandbox.Release(ctx, h, "")
}

// stopOwner kills the shim server that owns st, if it runs and is not
// this process: containerd has given up on it, and it must not go on
// recording.
func stopOwner(ctx context.Context, sid string, st state.Sandbox) error {
	if st.ShimPid <= 0 || st.ShimPid == os.Getpid() {
		return nil
	}
	owner := state.Resource{Kind: state.KindProcess, Key: "shim", Pid: st.ShimPid, StartTime: st.ShimStartTime}
	if !state.ProcessAlive(owner.Pid, owner.StartTime) {
		return nil
	}
	log.G(ctx).WithField("sandbox", sid).WithField("shim_pid", owner.Pid).Warn("killing the sandbox's shim: containerd has deleted its sandbox task")
	if err := state.ReleaseProcess(ctx, owner); err != nil {
		return fmt.Errorf("killing shim %d of sandbox %s: %w", owner.Pid, sid, err)
	}
	return nil
}
