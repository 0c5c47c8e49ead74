package hostcheck

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/hull-runtime/hull/internal/vm/qemu"
)

// QEMUInfo is the hypervisor binary found.
type QEMUInfo struct {
	Path    string `json:"path,omitempty"` // resolved path, "" when not found
	Version string `json:"version,omitempty"`
}

const qemuFix = "apt-get install qemu-system-x86"

// QEMU finds the QEMU binary (an absolute path, a name looked up on
// PATH, or "" for the one qemu.DefaultBinary chooses) and asks it for its
// version.
func QEMU(ctx context.Context, path string) (QEMUInfo, Result) {
	res := Result{Name: "qemu"}
	if path == "" {
		path = qemu.DefaultBinary()
	}
	p, err := exec.LookPath(path)
	if err != nil {
		res.Detail = fmt.Sprintf("%s not found: %v", path, unwrapPath(err))
		res.Fix = qemuFix
		if strings.Contains(path, "/") {
			res.Fix += ", or set hypervisor.qemu.path to the QEMU binary"
		}
		return QEMUInfo{}, res
	}
	info := QEMUInfo{Path: p}
	out, err := versionOf(ctx, p)
	if err != nil {
		res.Detail = fmt.Sprintf("%s --version: %v", p, err)
		res.Fix = qemuFix
		return info, res
	}
	// "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)"
	info.Version = strings.TrimPrefix(out, "QEMU emulator version ")
	res.OK = true
	res.Detail = p + ": " + out
	return info, res
}

// Containerd returns containerd's version ("" when it is not found). Hull
// runs without it (hull run), so the result is always OK.
func Containerd(ctx context.Context) (string, Result) {
	res := Result{Name: "containerd", OK: true}
	p, err := exec.LookPath("containerd")
	if err != nil {
		res.Detail = "not found"
		return "", res
	}
	out, err := versionOf(ctx, p)
	if err != nil {
		res.Detail = fmt.Sprintf("%s --version: %v", p, err)
		return "", res
	}
	// "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1"
	version := out
	if f := strings.Fields(out); len(f) >= 3 {
		version = f[2]
	}
	res.Detail = p + ": " + out
	return version, res
}

// versionOf runs `bin --version` and returns its first line.
func versionOf(ctx context.Context, bin string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.WaitDelay = time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return "", fmt.Errorf("%w: %s", err, firstLine(msg))
		}
		return "", err
	}
	line := firstLine(string(out))
	if line == "" {
		return "", fmt.Errorf("printed no version")
	}
	return line, nil
}

func firstLine(s string) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	if sc.Scan() {
		return strings.TrimSpace(sc.Text())
	}
	return ""
}

// fileProbe checks that path is a readable regular file.
func fileProbe(name, path, fix string) Result {
	res := Result{Name: name}
	if err := readableFile(path); err != nil {
		res.Detail = err.Error()
		res.Fix = fix
		return res
	}
	res.OK = true
	res.Detail = path
	return res
}

func readableFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	return nil
}
