package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hull-runtime/hull/internal/releasers"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/template"
)

// gcReleasers builds the releasers `hull gc` uses: the shim's
// (internal/releasers); tests replace it.
var gcReleasers = releasers.All

// gcLockWait is how long gc waits for a sandbox's lock. A dead owner holds
// no lock; a held one means another process (`shim delete`, another gc)
// is working on the sandbox, so gc leaves it alone.
var gcLockWait = 5 * time.Second

// ownerGone says whether nobody owns sb any more, and why. A sandbox is
// orphaned when its shim is not running (or its pid now belongs to
// another process), or when its shim runs but containerd has deleted the
// sandbox task: the task's bundle, recorded in the state, is gone as the
// shim sees the filesystem (through /proc/<shim>/root, so a shim in
// another mount namespace is judged by its own view). containerd removes
// a bundle only after the task's delete, and a shim that deleted its
// sandbox task normally has released its state already, so a state that
// outlives its bundle is one a shim will not release.
func ownerGone(sb state.Sandbox) (bool, string) {
	if sb.ShimPid == 0 {
		return false, "no owner recorded"
	}
	if !state.ProcessAlive(sb.ShimPid, sb.ShimStartTime) {
		return true, fmt.Sprintf("shim %d is gone", sb.ShimPid)
	}
	if sb.Bundle != "" && filepath.IsAbs(sb.Bundle) {
		_, err := os.Lstat(filepath.Join("/proc", strconv.Itoa(sb.ShimPid), "root", sb.Bundle))
		if errors.Is(err, fs.ErrNotExist) && state.ProcessAlive(sb.ShimPid, sb.ShimStartTime) {
			return true, fmt.Sprintf("shim %d is running but containerd deleted the sandbox task (bundle %s is gone)", sb.ShimPid, sb.Bundle)
		}
	}
	return false, fmt.Sprintf("shim %d is running", sb.ShimPid)
}

// killOwner kills an orphaned sandbox's shim if it still runs, so that it
// records nothing more while gc releases what it held.
func killOwner(ctx context.Context, sb state.Sandbox) error {
	owner := state.Resource{Kind: state.KindProcess, Key: "shim", Pid: sb.ShimPid, StartTime: sb.ShimStartTime}
	if sb.ShimPid <= 0 || sb.ShimPid == os.Getpid() || !state.ProcessAlive(owner.Pid, owner.StartTime) {
		return nil
	}
	if err := state.ReleaseProcess(ctx, owner); err != nil {
		return fmt.Errorf("killing shim %d: %w", sb.ShimPid, err)
	}
	return nil
}

func gcCmd(args []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("hull gc", flag.ContinueOnError)
	fset.SetOutput(stderr)
	var rf stateRootFlags
	rf.register(fset)
	dryRun := fset.Bool("dry-run", false, "print what would be released and change nothing")
	if err := fset.Parse(args); err != nil {
		return 2
	}
	if fset.NArg() > 0 {
		fmt.Fprintf(stderr, "hull gc: unexpected argument %q\n", fset.Arg(0))
		return 2
	}
	root, err := rf.resolve()
	if err != nil {
		fmt.Fprintf(stderr, "hull gc: %v\n", err)
		return 1
	}
	ctx := context.Background()
	store := &state.Store{Root: root}
	failed := false
	report := func(err error) {
		failed = true
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "hull gc: %s\n", line)
		}
	}

	list, err := store.List()
	if err != nil {
		report(err) // unreadable sandboxes: go on with the others
	}
	found := 0
	for _, sb := range list {
		if gone, why := ownerGone(sb); !gone {
			if sb.ShimPid == 0 {
				fmt.Fprintf(stderr, "hull gc: sandbox %s: %s, left alone\n", sb.ID, why)
			}
			continue
		}
		found++
		if *dryRun {
			_, why := ownerGone(sb)
			fmt.Fprintf(stdout, "sandbox %s: %s\n", sb.ID, why)
			for _, r := range state.ReleaseOrder(sb, "") {
				fmt.Fprintf(stdout, "would release %s\n", r)
			}
			fmt.Fprintf(stdout, "would remove sandbox %s\n", sb.ID)
			continue
		}
		if err := collect(ctx, store, sb.ID, stdout); err != nil {
			report(err)
		}
	}

	stale, err := template.NewStore(root, nil).GC(*dryRun)
	for _, name := range stale {
		found++
		if *dryRun {
			fmt.Fprintf(stdout, "would remove stale VM template %s\n", name)
		} else {
			fmt.Fprintf(stdout, "removed stale VM template %s\n", name)
		}
	}
	if err != nil {
		report(err)
	}
	if !*dryRun {
		swept, err := store.Sweep()
		for _, p := range swept {
			found++
			fmt.Fprintf(stdout, "removed leftover %s\n", p)
		}
		if err != nil {
			report(err)
		}
	}
	if found == 0 {
		fmt.Fprintln(stdout, "nothing to collect")
	}
	if failed {
		return 1
	}
	return 0
}

// collect releases one orphaned sandbox under its lock, checking again
// that its owner is gone, and prints a line per resource released.
func collect(ctx context.Context, store *state.Store, id string, stdout io.Writer) error {
	lctx, cancel := context.WithTimeout(ctx, gcLockWait)
	h, err := store.OpenContext(lctx, id)
	cancel()
	if errors.Is(err, fs.ErrNotExist) {
		return nil // released meanwhile
	}
	if errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintf(stdout, "sandbox %s: locked by another process, left alone\n", id)
		return nil
	}
	if err != nil {
		return err
	}
	defer h.Close()
	sb := h.State()
	gone, why := ownerGone(sb)
	if !gone {
		return nil
	}
	fmt.Fprintf(stdout, "sandbox %s: %s\n", id, why)
	if state.ProcessAlive(sb.ShimPid, sb.ShimStartTime) {
		if err := killOwner(ctx, sb); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		fmt.Fprintf(stdout, "killed shim %d\n", sb.ShimPid)
	}
	rs := state.Releasers{}
	for kind, fn := range gcReleasers() {
		rs[kind] = func(ctx context.Context, r state.Resource) error {
			if err := fn(ctx, r); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "released %s\n", r)
			return nil
		}
	}
	if err := state.Release(ctx, h, "", rs); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	fmt.Fprintf(stdout, "removed sandbox %s\n", id)
	return nil
}
