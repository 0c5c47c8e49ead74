// Package mountinfo reads a mount namespace's table of mounts,
// /proc/<pid>/mountinfo (proc(5)), in one place: the fields Hull uses,
// with the kernel's octal escapes in paths undone.
package mountinfo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Mount is one line:
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//	ID Parent Dev Root MountPoint Options [optional...] - FSType Source SuperOptions
type Mount struct {
	ID, Parent   uint64
	Dev          string // major:minor
	Root         string // the mounted directory within its filesystem
	MountPoint   string
	Options      string   // per-mount options
	Optional     []string // shared:N, master:N, ...
	FSType       string
	Source       string
	SuperOptions string
}

// Read parses /proc/self/mountinfo.
func Read() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ms, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("reading /proc/self/mountinfo: %w", err)
	}
	return ms, nil
}

// Parse parses a mountinfo listing; malformed lines are skipped.
func Parse(r io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := slices.Index(f, "-")
		if sep < 6 || len(f) < sep+3 {
			continue
		}
		id, err1 := strconv.ParseUint(f[0], 10, 64)
		parent, err2 := strconv.ParseUint(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		m := Mount{
			ID: id, Parent: parent, Dev: f[2], Root: Unescape(f[3]), MountPoint: Unescape(f[4]), Options: f[5],
			Optional: f[6:sep], FSType: f[sep+1], Source: Unescape(f[sep+2]),
		}
		if len(f) > sep+3 {
			m.SuperOptions = f[sep+3]
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// Unescape undoes the kernel's octal escapes in a mountinfo path (\040
// for a space, \011, \012, \134).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Under returns the mount points at or below dir, in table order (a
// path mounted over twice appears twice).
func Under(ms []Mount, dir string) []string {
	var out []string
	prefix := strings.TrimSuffix(dir, "/") + "/"
	for _, m := range ms {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, prefix) {
			out = append(out, m.MountPoint)
		}
	}
	return out
}
