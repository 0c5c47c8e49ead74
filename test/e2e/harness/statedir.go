package harness

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"
)

// Each harness containerd gives Hull a state root of its own
// (runtime.state_dir): its sandboxes' directories are apart from the
// host's /run/hull and from every other test's, so a test's `hull gc` or
// leak check sees only its own pods. The root is short (/run/hull-e2e-X):
// QEMU's sockets live in it, within the 108 bytes of a socket path.

// stateDirFor is the state root of the containerd whose network
// namespace is netns (hull-e2e-XXXXXXXX).
func stateDirFor(netns string) string { return filepath.Join("/run", netns) }

// withStateDir writes, into dir, a copy of the Hull configuration at path
// with runtime.state_dir set to stateDir, and returns the copy's path. A
// configuration that sets state_dir itself, or is not valid TOML (a test
// of a broken configuration), is used as it is.
func withStateDir(path, dir, stateDir string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var doc map[string]any
	if _, err := toml.Decode(string(b), &doc); err != nil {
		return path, nil
	}
	rt, _ := doc["runtime"].(map[string]any)
	if _, set := rt["state_dir"]; set {
		return path, nil
	}
	if rt == nil {
		rt = map[string]any{}
		doc["runtime"] = rt
	}
	rt["state_dir"] = stateDir
	var out strings.Builder
	fmt.Fprintf(&out, "# %s, with the test containerd's own state root\n", path)
	if err := toml.NewEncoder(&out).Encode(doc); err != nil {
		return "", fmt.Errorf("encoding %s: %w", path, err)
	}
	copyPath := filepath.Join(dir, "hull-"+strings.ReplaceAll(strings.Trim(path, "/"), "/", "_"))
	return copyPath, os.WriteFile(copyPath, []byte(out.String()), 0o644)
}

// useOwnStateDir points every Hull handler's configuration of o at
// stateDir (copies in dir).
func useOwnStateDir(o *Options, dir, stateDir string) error {
	var errs []error
	conv := func(p string) string {
		q, err := withStateDir(p, dir, stateDir)
		errs = append(errs, err)
		return q
	}
	o.HullConfig = conv(o.HullConfig)
	o.BrokenHullConfig = conv(o.BrokenHullConfig)
	// Copies: the maps are the caller's.
	o.HullHandlers, o.HostDeviceHandlers = maps.Clone(o.HullHandlers), maps.Clone(o.HostDeviceHandlers)
	for _, m := range []map[string]string{o.HullHandlers, o.HostDeviceHandlers} {
		for name, p := range m {
			m[name] = conv(p)
		}
	}
	return errors.Join(errs...)
}
