package container

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/hull-runtime/hull/internal/guest/errdefs"
)

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %w", field, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

// ValidateID checks a container or exec id.
func ValidateID(kind, id string) error {
	if id == "" {
		return invalid(kind, "must not be empty")
	}
	if len(id) > 256 || strings.ContainsAny(id, "/\x00") || id == "." || id == ".." {
		return invalid(kind, "%q is not a valid id", id)
	}
	return nil
}

// buildSpecFields fills encoding/json's field cache for the spec and
// every type it can reach: encoding a zero Spec builds their encoders,
// and with them the cache ParseSpec's decoding shares, which it would
// otherwise build on a VM's first container (in every clone of a
// template again, docs/templates.md).
func buildSpecFields() error {
	if _, err := json.Marshal(&specs.Spec{}); err != nil {
		return fmt.Errorf("building the oci spec's decoding state: %w", err)
	}
	return nil
}

// ParseSpec decodes and validates an OCI runtime spec.
func ParseSpec(data []byte) (*specs.Spec, error) {
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("parsing oci spec: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if s.Root == nil || s.Root.Path == "" {
		return nil, invalid("root.path", "must be set")
	}
	if !filepath.IsAbs(s.Root.Path) {
		return nil, invalid("root.path", "%q must be an absolute guest path", s.Root.Path)
	}
	if s.Process == nil {
		return nil, invalid("process", "must be set")
	}
	if err := ValidateProcess("process", s.Process); err != nil {
		return nil, err
	}
	if err := validateLinuxSecurity(s.Linux); err != nil {
		return nil, err
	}
	for i, m := range s.Mounts {
		if !filepath.IsAbs(m.Destination) {
			return nil, invalid(fmt.Sprintf("mounts[%d].destination", i), "%q must be absolute", m.Destination)
		}
	}
	return &s, nil
}

// ParseProcess decodes and validates an OCI process (ExecProcess).
func ParseProcess(data []byte) (*specs.Process, error) {
	var p specs.Process
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("parsing oci process: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := ValidateProcess("process", &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// ValidateProcess checks the fields the agent relies on.
func ValidateProcess(field string, p *specs.Process) error {
	if len(p.Args) == 0 || p.Args[0] == "" {
		return invalid(field+".args", "must not be empty")
	}
	if p.Cwd != "" && !filepath.IsAbs(p.Cwd) {
		return invalid(field+".cwd", "%q must be absolute", p.Cwd)
	}
	return validateProcessSecurity(field, p)
}
