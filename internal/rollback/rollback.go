// Package rollback is a stack of undo steps for multi-step bring-ups:
// register the undo right after the step that acquired a resource, and
// unwind the stack on failure (or at teardown, so there is one path).
package rollback

import (
	"errors"
	"fmt"
	"sync"
)

// Stack holds undo steps; the zero value is ready to use.
type Stack struct {
	mu sync.Mutex
	// steps is guarded by mu; run last-in first-out.
	steps []step
}

type step struct {
	name string
	undo func() error
}

// Add registers undo for the resource called name.
func (s *Stack) Add(name string, undo func() error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps = append(s.steps, step{name: name, undo: undo})
}

// Release forgets every step: the bring-up succeeded and the resources
// now belong to someone else.
func (s *Stack) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps = nil
}

// Unwind runs every step in reverse order, even after a failure, and joins
// their errors. Unwinding twice runs each step once.
func (s *Stack) Unwind() error {
	s.mu.Lock()
	steps := s.steps
	s.steps = nil
	s.mu.Unlock()
	var errs []error
	for i := len(steps) - 1; i >= 0; i-- {
		if err := steps[i].undo(); err != nil {
			errs = append(errs, fmt.Errorf("releasing %s: %w", steps[i].name, err))
		}
	}
	return errors.Join(errs...)
}
