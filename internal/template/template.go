// Package template keeps VM templates (docs/templates.md): a guest that
// booted once with its RAM in a file, stopped in its agent, and whose
// device state was saved. A pod's VM of the same shape is restored from
// it instead of booted; it maps the memory file copy-on-write.
//
// Templates live in <state root>/.templates (a name `hull ps` never takes
// for a sandbox): <key>/ holds memory, state and meta.json; <key>.lock is
// the lock a build holds; <key>.build/ is a build in progress, renamed to
// <key>/ when complete. A reader needs no lock: a template directory is
// complete or absent, and a clone that has mapped it keeps it alive after
// a removal.
package template

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// Version is the template format, and of what the driver adds to a
// template's guest beyond its shape (kernel parameters, devices); a
// template of another version is unusable and rebuilt. 2: noapictimer
// under TCG. 3: a balloon (free page reporting). 4: noreplace-smp under
// TCG, pcie_ports=compat on q35.
const Version = 4

// DirName is the templates' directory inside a state root.
const DirName = ".templates"

// File names inside a template's directory.
const (
	memoryName = "memory"
	stateName  = "state"
	metaName   = "meta.json"
	// emptyName is the directory a template's shares point at while it
	// is built: the guest never mounts them before the clone.
	emptyName = "empty"
)

// Shape is everything a restored VM shares with its template. Two VMs
// of equal shapes, whose files have equal contents, can be clones of
// one template.
type Shape struct {
	QEMU         string   `json:"qemu"`
	Kernel       string   `json:"kernel"`
	Initrd       string   `json:"initrd"`
	Firmware     string   `json:"firmware,omitempty"`
	MachineType  string   `json:"machine_type"`
	Accel        string   `json:"accel"`
	VCPUs        int      `json:"vcpus"`
	MemoryMiB    int      `json:"memory_mib"`
	KernelParams []string `json:"kernel_params"`
	// ShareTags are the 9p tags of the VM's shares, in order.
	ShareTags []string `json:"share_tags"`
	// NICs is the number of network cards.
	NICs int `json:"nics"`
}

// Meta is a template's meta.json.
type Meta struct {
	Version int       `json:"version"`
	Key     string    `json:"key"`
	Shape   Shape     `json:"shape"`
	Created time.Time `json:"created"`
	// Inputs are the identity of each file of the shape, by path
	// (fileIdentity): a template whose files changed since is stale.
	Inputs map[string]string `json:"inputs"`
	// StateSHA256 is the saved device state's digest, checked before each
	// restore.
	StateSHA256 string `json:"state_sha256"`
	// BuildMs is how long the build took.
	BuildMs int64 `json:"build_ms"`
}

// files are the shape's input files, the ones its key hashes.
func (s Shape) files() []string {
	fs := []string{s.QEMU, s.Kernel, s.Initrd}
	if s.Firmware != "" {
		fs = append(fs, s.Firmware)
	}
	return fs
}

// inputs are the identities of the shape's files.
func (s Shape) inputs() (map[string]string, error) {
	in := map[string]string{}
	for _, p := range s.files() {
		id, err := fileIdentity(p)
		if err != nil {
			return nil, fmt.Errorf("template input: %w", err)
		}
		in[p] = id
	}
	return in, nil
}

// Key names the template for s: a digest of the shape and of its files'
// identities, so that a changed kernel, initrd, firmware or QEMU makes a
// new template and leaves the old one stale.
func (s Shape) Key() (string, error) {
	in, err := s.inputs()
	if err != nil {
		return "", err
	}
	return keyOf(s, in), nil
}

func keyOf(s Shape, inputs map[string]string) string {
	h := sha256.New()
	b, _ := json.Marshal(struct {
		Version int               `json:"version"`
		Shape   Shape             `json:"shape"`
		Inputs  map[string]string `json:"inputs"`
	}{Version, s, inputs})
	h.Write(b)
	// 128 bits: short enough for socket paths under the build directory.
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// fileIdentity names the file at path as it is now: device, inode, size,
// modification and change times. Replacing or rewriting the file changes
// it (the change time cannot be set back), and it costs a stat, not a
// read of ≈ 45 MiB of QEMU, kernel and initrd on every pod's start.
func fileIdentity(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	return fmt.Sprintf("dev %d ino %d size %d mtime %d.%09d ctime %d.%09d", st.Dev, st.Ino, st.Size,
		st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec), nil
}

// PlaceholderMAC is the MAC of a template's NIC i: a clone's agent is
// told to change it to the pod's (NetInterface.guest_mac).
func PlaceholderMAC(i int) net.HardwareAddr {
	// Locally administered, unicast; "hu" in the second and third bytes.
	return net.HardwareAddr{0x02, 0x68, 0x75, 0x00, byte(i >> 8), byte(i)}
}

// Clone is what a restored VM needs from its template.
type Clone struct {
	Key string
	// MemoryPath is the template's RAM, to map copy-on-write.
	MemoryPath string
	// State is the saved device state, open and checked; the caller
	// closes it once the VM has started.
	State *os.File
}

// Info describes a template for `hull template ls` and `hull ps`.
type Info struct {
	Key   string
	Dir   string
	Meta  Meta
	Stale bool
	// Err says why the template is unusable; nil when it is.
	Err error
	// DiskBytes is what its files occupy.
	DiskBytes int64
}

// readMeta reads and checks dir's meta.json against key.
func readMeta(dir, key string) (Meta, error) {
	var m Meta
	b, err := os.ReadFile(filepath.Join(dir, metaName))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("template %s: %s: %w", key, metaName, err)
	}
	if m.Version != Version {
		return m, fmt.Errorf("template %s: format version %d, want %d", key, m.Version, Version)
	}
	if m.Key != key {
		return m, fmt.Errorf("template %s: %s names key %q", key, metaName, m.Key)
	}
	return m, nil
}

// openClone opens the template in dir for a restore, checking that its
// memory file is whole and its state file is the one recorded.
func openClone(dir, key string) (*Clone, error) {
	m, err := readMeta(dir, key)
	if err != nil {
		return nil, err
	}
	mem := filepath.Join(dir, memoryName)
	fi, err := os.Stat(mem)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", key, err)
	}
	if want := int64(m.Shape.MemoryMiB) << 20; fi.Size() != want {
		return nil, fmt.Errorf("template %s: memory file holds %d bytes, want %d", key, fi.Size(), want)
	}
	f, err := os.Open(filepath.Join(dir, stateName))
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", key, err)
	}
	got, err := digest(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("template %s: reading its state: %w", key, err)
	}
	if got != m.StateSHA256 {
		f.Close()
		return nil, fmt.Errorf("template %s: state file digest %s, recorded %s (corrupt)", key, got[:16], short(m.StateSHA256))
	}
	return &Clone{Key: key, MemoryPath: mem, State: f}, nil
}

// digest is the SHA-256 (hex) of f's whole content; f is left at its
// start, to be read again.
func digest(f *os.File) (string, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func short(s string) string {
	if len(s) > 16 {
		return s[:16]
	}
	return s
}

// info describes the template directory dir named key.
func info(dir, key string) Info {
	in := Info{Key: key, Dir: dir, DiskBytes: diskBytes(dir)}
	m, err := readMeta(dir, key)
	in.Meta = m
	if err != nil {
		in.Err = err
		in.Stale = true
		return in
	}
	now, err := m.Shape.inputs()
	if err != nil || !maps.Equal(now, m.Inputs) {
		in.Stale = true
	}
	return in
}

// diskBytes is the space the files under dir occupy (a memory file is
// sparse: only what the template's guest touched).
func diskBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			} else {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// sortedKeys are the keys of template directories in dir's listing.
func sortedKeys(ents []os.DirEntry) []string {
	var keys []string
	for _, e := range ents {
		if e.IsDir() && validKey(e.Name()) {
			keys = append(keys, e.Name())
		}
	}
	slices.Sort(keys)
	return keys
}

// validKey reports whether s looks like a key (32 lowercase hex digits).
func validKey(s string) bool {
	if len(s) != 32 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// errNoTemplate is returned for a key with no template.
var errNoTemplate = errors.New("no such template")
