// Package cpio writes "newc" (SVR4, magic 070701) cpio archives, the format the
// Linux kernel unpacks as an initramfs.
//
// Writer emits entries exactly as given. Archive collects entries and writes
// them reproducibly: sorted by path with parents first, implicit parent
// directories added, modes normalised, owners and mtimes fixed, inodes
// numbered in output order.
package cpio

import (
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
)

// File type bits of the cpio mode field (the same values as in stat(2)).
const (
	TypeMask    = 0o170000
	TypeDir     = 0o040000
	TypeReg     = 0o100000
	TypeSymlink = 0o120000
	TypeChar    = 0o020000
	TypeBlock   = 0o060000
)

const (
	magic      = "070701"
	headerLen  = 110
	trailer    = "TRAILER!!!"
	maxField   = 0xffffffff
	dataAlign  = 4
	blockAlign = 512
)

// Header is one archive member as it is written.
type Header struct {
	Name     string // path inside the archive, without a leading "/"
	Ino      uint32
	Mode     uint32 // type and permission bits
	UID, GID uint32
	Nlink    uint32
	Mtime    uint32
	Size     uint32
	DevMajor uint32 // device holding the file (normally 0)
	DevMinor uint32
	RdevMaj  uint32 // device number of a character or block device node
	RdevMin  uint32
}

// Writer writes newc records to an underlying writer.
type Writer struct {
	w      io.Writer
	n      int64
	closed bool
}

// NewWriter returns a Writer that writes to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// WriteEntry writes one record. data must be len(data) == h.Size bytes; for a
// symlink it is the link target.
func (w *Writer) WriteEntry(h Header, data []byte) error {
	if w.closed {
		return errors.New("cpio: write after close")
	}
	if h.Name == "" || strings.ContainsRune(h.Name, 0) {
		return fmt.Errorf("cpio: invalid name %q", h.Name)
	}
	if uint64(len(data)) != uint64(h.Size) || uint64(len(data)) > maxField {
		return fmt.Errorf("cpio: %s: size %d does not match %d data bytes", h.Name, h.Size, len(data))
	}
	namesize := len(h.Name) + 1
	fields := [...]uint32{h.Ino, h.Mode, h.UID, h.GID, h.Nlink, h.Mtime, h.Size,
		h.DevMajor, h.DevMinor, h.RdevMaj, h.RdevMin, uint32(namesize), 0}
	buf := make([]byte, 0, headerLen+namesize+dataAlign)
	buf = append(buf, magic...)
	for _, f := range fields {
		buf = fmt.Appendf(buf, "%08X", f)
	}
	buf = append(buf, h.Name...)
	buf = append(buf, 0)
	buf = pad(buf, len(buf))
	if err := w.write(buf); err != nil {
		return err
	}
	if err := w.write(data); err != nil {
		return err
	}
	return w.write(make([]byte, padLen(len(data))))
}

// Close writes the TRAILER!!! record and pads the archive to a multiple of
// 512 bytes, as cpio(1) does. It does not close the underlying writer.
func (w *Writer) Close() error {
	if w.closed {
		return nil
	}
	if err := w.WriteEntry(Header{Name: trailer, Nlink: 1}, nil); err != nil {
		return err
	}
	w.closed = true
	if r := w.n % blockAlign; r != 0 {
		return w.write(make([]byte, blockAlign-r))
	}
	return nil
}

func (w *Writer) write(b []byte) error {
	n, err := w.w.Write(b)
	w.n += int64(n)
	if err != nil {
		return fmt.Errorf("cpio: writing: %w", err)
	}
	return nil
}

func padLen(n int) int { return (dataAlign - n%dataAlign) % dataAlign }

func pad(b []byte, n int) []byte { return append(b, make([]byte, padLen(n))...) }

// Archive is an in-memory set of entries written reproducibly by WriteTo.
type Archive struct {
	// Mtime is stamped on every entry (0 unless set).
	Mtime   uint32
	entries map[string]entry
}

type entry struct {
	mode             uint32
	data             []byte
	rdevMaj, rdevMin uint32
}

func (a *Archive) add(p string, e entry) error {
	name, err := clean(p)
	if err != nil {
		return err
	}
	if a.entries == nil {
		a.entries = make(map[string]entry)
	}
	if old, ok := a.entries[name]; ok {
		// Adding the same directory twice is harmless; anything else is a
		// conflict the caller must resolve.
		if old.mode&TypeMask == TypeDir && e.mode&TypeMask == TypeDir {
			return nil
		}
		return fmt.Errorf("cpio: duplicate entry %q", "/"+name)
	}
	a.entries[name] = e
	return nil
}

// AddDir adds a directory (mode 0755).
func (a *Archive) AddDir(p string) error { return a.add(p, entry{mode: TypeDir | 0o755}) }

// AddFile adds a regular file: mode 0755 if executable, else 0644. The
// archive keeps a reference to data.
func (a *Archive) AddFile(p string, data []byte, executable bool) error {
	perm := uint32(0o644)
	if executable {
		perm = 0o755
	}
	return a.add(p, entry{mode: TypeReg | perm, data: data})
}

// AddSymlink adds a symbolic link to target.
func (a *Archive) AddSymlink(p, target string) error {
	if target == "" {
		return fmt.Errorf("cpio: symlink %q: empty target", p)
	}
	return a.add(p, entry{mode: TypeSymlink | 0o777, data: []byte(target)})
}

// AddCharDev adds a character device node (mode 0600 for console-like nodes
// is a policy the caller chooses via perm).
func (a *Archive) AddCharDev(p string, perm, major, minor uint32) error {
	return a.add(p, entry{mode: TypeChar | perm&0o777, rdevMaj: major, rdevMin: minor})
}

// Paths returns the archive's paths (with a leading "/") in the order WriteTo
// writes them, including implicit parent directories.
func (a *Archive) Paths() []string {
	names := a.names()
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = "/" + n
	}
	return out
}

// names returns all entry names plus missing parents, in output order.
func (a *Archive) names() []string {
	set := make(map[string]bool, len(a.entries))
	for n := range a.entries {
		for p := n; p != "." && !set[p]; p = path.Dir(p) {
			set[p] = true
		}
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	slices.SortFunc(names, comparePaths)
	return names
}

// comparePaths orders paths component by component, so a directory sorts
// directly before its contents.
func comparePaths(a, b string) int {
	as, bs := strings.Split(a, "/"), strings.Split(b, "/")
	return slices.Compare(as, bs)
}

// WriteTo writes the whole archive, trailer included.
func (a *Archive) WriteTo(w io.Writer) (int64, error) {
	cw := &countWriter{w: w}
	cp := NewWriter(cw)
	for i, n := range a.names() {
		e, ok := a.entries[n]
		if !ok {
			e = entry{mode: TypeDir | 0o755}
		} else if e.mode&TypeMask != TypeDir && a.hasChildren(n) {
			return cw.n, fmt.Errorf("cpio: %q is not a directory but has entries below it", "/"+n)
		}
		nlink := uint32(1)
		if e.mode&TypeMask == TypeDir {
			nlink = 2
		}
		h := Header{
			Name: n, Ino: uint32(i + 1), Mode: e.mode, Nlink: nlink, Mtime: a.Mtime,
			Size: uint32(len(e.data)), RdevMaj: e.rdevMaj, RdevMin: e.rdevMin,
		}
		if err := cp.WriteEntry(h, e.data); err != nil {
			return cw.n, err
		}
	}
	err := cp.Close()
	return cw.n, err
}

func (a *Archive) hasChildren(n string) bool {
	prefix := n + "/"
	for k := range a.entries {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

func clean(p string) (string, error) {
	if p == "" || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("cpio: invalid path %q", p)
	}
	c := strings.TrimPrefix(path.Clean("/"+p), "/")
	if c == "" {
		return "", fmt.Errorf("cpio: path %q names the root", p)
	}
	if c == trailer {
		return "", fmt.Errorf("cpio: path %q is reserved", p)
	}
	return c, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
