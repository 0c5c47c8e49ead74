package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Version is a containerd the harness can run: Debian's (on PATH) or one
// that hack/build-compat.sh built into the cache.
type Version struct {
	// Name is what HULL_CONTAINERD selects: "1.6", "1.7", "2.2", "2.4".
	Name string
	// Release is the full version, e.g. "2.4.2".
	Release string
	// BinDir holds containerd, ctr and this version's
	// containerd-shim-runc-v2; "" for the binaries on PATH.
	BinDir string
}

// Versions lists the containerd versions `make test` runs, by name:
// Debian's 1.6.20 and the ones hack/build-compat.sh builds (its versions).
var Versions = []string{"1.6", "1.7", "2.2", "2.4"}

var releases = map[string]string{"1.6": "1.6.20", "1.7": "1.7.35", "2.2": "2.2.9", "2.4": "2.4.2"}

// CacheDir is where hack/build-compat.sh keeps what it builds:
// HULL_CACHE, by default /var/cache/hull.
func CacheDir() string {
	if d := os.Getenv("HULL_CACHE"); d != "" {
		return d
	}
	return "/var/cache/hull"
}

// LookupVersion resolves a version name ("1.6" is Debian's containerd on
// PATH; the others are in CacheDir).
func LookupVersion(name string) (Version, error) {
	rel, ok := releases[name]
	if !ok {
		return Version{}, fmt.Errorf("unknown containerd version %q (want one of %v)", name, Versions)
	}
	v := Version{Name: name, Release: rel}
	if name != "1.6" {
		v.BinDir = filepath.Join(CacheDir(), "containerd-"+rel, "bin")
	}
	return v, nil
}

// SelectedVersion is the containerd that HULL_CONTAINERD names, Debian's
// 1.6 when unset.
func SelectedVersion() (Version, error) {
	name := os.Getenv("HULL_CONTAINERD")
	if name == "" {
		name = "1.6"
	}
	return LookupVersion(name)
}

// Major is the version's major number: 2 writes a version 3
// configuration, with CRI split into its 2.x plugins.
func (v Version) Major() int {
	if len(v.Name) > 0 && v.Name[0] == '2' {
		return 2
	}
	return 1
}

// Bin is the path of one of the version's commands (containerd, ctr).
func (v Version) Bin(name string) string {
	if v.BinDir == "" {
		return name
	}
	return filepath.Join(v.BinDir, name)
}

// Missing says which of the version's binaries cannot be run ("" when
// all can): containerd, ctr and its runc shim.
func (v Version) Missing() string {
	for _, bin := range []string{"containerd", "ctr", "containerd-shim-runc-v2"} {
		if v.BinDir == "" {
			if _, err := exec.LookPath(bin); err != nil {
				return fmt.Sprintf("needs %s in PATH (make deps)", bin)
			}
			continue
		}
		if _, err := os.Stat(v.Bin(bin)); err != nil {
			return fmt.Sprintf("containerd %s: needs %s (built by hack/build-compat.sh): %v", v.Release, v.Bin(bin), err)
		}
	}
	return ""
}

func (v Version) String() string { return "containerd " + v.Release }
