package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/sandbox"
)

// annotationSandboxID is the CRI annotation the shim groups tasks by; it
// tells the sandbox container by sandbox.AnnotationContainerType.
const annotationSandboxID = "io.kubernetes.cri.sandbox-id"

// task is one container of the pod (the sandbox container included).
type task struct {
	id, sandboxID, bundle string
	// isSandbox: this task owns the VM; deleting it stops the VM.
	isSandbox bool
	// failpoints armed for the container steps of this task, and
	// sandboxFailpoints for the pod's (the spec's annotation as is).
	failpoints, sandboxFailpoints failpoint.Set
	init                          *proc

	// mu guards execs.
	mu    sync.Mutex
	execs map[string]*proc

	// deleteMu serialises Deletes of the init process; released: its
	// resources are released (a Delete whose caller stopped waiting
	// keeps the task until it is asked again, service.Delete). A
	// released task does not hold the shim up (exitIfIdle).
	deleteMu sync.Mutex
	released atomic.Bool
}

func (t *task) proc(execID string) (*proc, bool) {
	if execID == "" {
		return t.init, true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.execs[execID]
	return p, ok
}

func (t *task) procs() []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	ps := []*proc{t.init}
	for _, p := range t.execs {
		ps = append(ps, p)
	}
	return ps
}

// readSpec reads <bundle>/config.json.
func readSpec(bundle string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("reading oci spec: %w", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parsing oci spec %s: %w", filepath.Join(bundle, "config.json"), err)
	}
	return &s, nil
}

// sandboxOf returns the id of the sandbox a container belongs to, and
// whether the container is that sandbox. A container without CRI
// annotations (`ctr run`) is its own sandbox.
func sandboxOf(id string, annotations map[string]string) (string, bool) {
	sid := annotations[annotationSandboxID]
	if sid == "" {
		return id, true
	}
	return sid, sid == id || annotations[sandbox.AnnotationContainerType] == sandbox.ContainerTypeSandbox
}
