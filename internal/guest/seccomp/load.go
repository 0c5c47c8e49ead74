package seccomp

import (
	"fmt"
	"unsafe"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Filter is a compiled profile, ready to load.
type Filter struct {
	prog  []unix.SockFilter
	flags uint
}

// New compiles the profile; errors name what could not be compiled.
func New(s *specs.LinuxSeccomp) (*Filter, error) {
	flags, err := Flags(s)
	if err != nil {
		return nil, err
	}
	prog, err := Compile(s)
	if err != nil {
		return nil, err
	}
	return &Filter{prog: prog, flags: flags}, nil
}

// Load installs the filter on the calling thread (all threads with
// SECCOMP_FILTER_FLAG_TSYNC). Without no_new_privs the caller needs
// CAP_SYS_ADMIN.
func (f *Filter) Load() error {
	prog := unix.SockFprog{Len: uint16(len(f.prog)), Filter: &f.prog[0]}
	// seccomp(SECCOMP_SET_MODE_FILTER, flags, &prog)
	_, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, uintptr(f.flags), uintptr(unsafe.Pointer(&prog)))
	if errno != 0 {
		return fmt.Errorf("loading seccomp filter (%d instructions, flags %#x): %w", len(f.prog), f.flags, errno)
	}
	return nil
}
