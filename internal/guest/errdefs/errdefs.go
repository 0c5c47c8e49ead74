// Package errdefs holds the error kinds the guest agent's packages return and
// its RPC layer converts to ttrpc status codes. Callers branch on them with
// errors.Is and errors.As; nothing matches on error strings.
package errdefs

import (
	"errors"
	"fmt"
)

var (
	// ErrNotFound: the named container or process does not exist (or has exited,
	// where a live process is required).
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: a container or exec id is already in use.
	ErrAlreadyExists = errors.New("already exists")
	// ErrInvalidArgument: a malformed request or spec.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrFailedPrecondition: the request does not fit the object's state.
	ErrFailedPrecondition = errors.New("failed precondition")
)

// ExecError reports that a container's command could not be executed: Code is
// 127 when it was not found and 126 when it was found but cannot be executed.
type ExecError struct {
	Code   int32
	Path   string
	Reason string
}

func (e *ExecError) Error() string {
	return fmt.Sprintf("exec %q: %s", e.Path, e.Reason)
}

// Is makes an ExecError match ErrFailedPrecondition.
func (e *ExecError) Is(target error) bool { return target == ErrFailedPrecondition }
