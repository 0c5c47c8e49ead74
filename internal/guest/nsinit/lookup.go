package nsinit

import (
	"errors"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultPath is used when the process's environment has no PATH.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// PathFromEnv returns the PATH of an environment, or DefaultPath.
func PathFromEnv(env []string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PATH="); ok {
			return v
		}
	}
	return DefaultPath
}

// checkExecutable returns nil when p is a regular file the caller may
// execute, or the ExecFailure a shell would report.
func checkExecutable(p string) *ExecFailure {
	st, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return &ExecFailure{Code: 127, Path: p, Reason: "no such file or directory"}
		}
		return &ExecFailure{Code: 126, Path: p, Reason: err.Error()}
	}
	if st.IsDir() {
		return &ExecFailure{Code: 126, Path: p, Reason: "is a directory"}
	}
	if !st.Mode().IsRegular() || unix.Access(p, unix.X_OK) != nil || st.Mode().Perm()&0o111 == 0 {
		return &ExecFailure{Code: 126, Path: p, Reason: "permission denied"}
	}
	return nil
}

// LookPath resolves a command the way execvp does, within the current root:
// a name with a slash is used as is (relative to cwd); otherwise each
// directory of path is tried. Not found is 127; found but not executable
// (a directory, no execute permission) is 126.
func LookPath(file, path string) (string, *ExecFailure) {
	if file == "" {
		return "", &ExecFailure{Code: 127, Path: file, Reason: "empty command"}
	}
	if strings.Contains(file, "/") {
		if f := checkExecutable(file); f != nil {
			return "", f
		}
		return file, nil
	}
	var denied *ExecFailure
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		f := checkExecutable(p)
		if f == nil {
			return p, nil
		}
		if f.Code == 126 && denied == nil {
			denied = f
		}
	}
	if denied != nil {
		return "", denied
	}
	return "", &ExecFailure{Code: 127, Path: file, Reason: "executable file not found in $PATH"}
}

// execFailure classifies an execve error.
func execFailure(path string, err error) *ExecFailure {
	code := int32(126)
	if errors.Is(err, unix.ENOENT) {
		code = 127
	}
	return &ExecFailure{Code: code, Path: path, Reason: err.Error()}
}
