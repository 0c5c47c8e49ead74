// Package sysctl checks and writes a container's spec.linux.sysctl. Only
// keys the kernel keeps per namespace are allowed, and only when the
// container has that namespace (its own, or the pod's, which in the VM is
// the guest's): the rules of runc's libcontainer/configs/validate.
package sysctl

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ipcKeys are the IPC namespace's sysctls besides fs.mqueue.*.
var ipcKeys = map[string]bool{
	"kernel.msgmax": true, "kernel.msgmnb": true, "kernel.msgmni": true, "kernel.sem": true,
	"kernel.shmall": true, "kernel.shmmax": true, "kernel.shmmni": true, "kernel.shm_rmid_forced": true,
}

// Normalize returns the dotted form of a key given with slashes
// ("net/ipv4/ip_forward"); a dot inside a slashed key (an interface
// "eth0.100") becomes a slash, as runc does.
func Normalize(key string) string {
	if !strings.Contains(key, "/") {
		return key
	}
	return swap(key)
}

// swap exchanges dots and slashes.
func swap(key string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '/':
			return '.'
		case '.':
			return '/'
		}
		return r
	}, key)
}

// Path is the file of a dotted key under root (/proc/sys).
func Path(root, key string) string {
	return filepath.Join(root, swap(key))
}

func has(nss []specs.LinuxNamespace, t specs.LinuxNamespaceType) bool {
	for _, ns := range nss {
		if ns.Type == t {
			return true
		}
	}
	return false
}

// Validate checks every key; the error names the first refused key.
func Validate(sysctl map[string]string, nss []specs.LinuxNamespace) error {
	for _, raw := range sortedKeys(sysctl) {
		key := Normalize(raw)
		if err := validKey(key); err != nil {
			return fmt.Errorf("sysctl %q: %w", raw, err)
		}
		switch {
		case ipcKeys[key] || strings.HasPrefix(key, "fs.mqueue."):
			if !has(nss, specs.IPCNamespace) {
				return fmt.Errorf("sysctl %q is not allowed in the guest's ipc namespace", raw)
			}
		case strings.HasPrefix(key, "net."):
			if !has(nss, specs.NetworkNamespace) {
				return fmt.Errorf("sysctl %q is not allowed in the guest's network namespace", raw)
			}
		case key == "kernel.domainname" && has(nss, specs.UTSNamespace):
		case key == "kernel.hostname" && has(nss, specs.UTSNamespace):
			return fmt.Errorf("sysctl %q is not allowed as it conflicts with the OCI %q field", raw, "hostname")
		default:
			return fmt.Errorf("sysctl %q is not in a separate kernel namespace", raw)
		}
	}
	return nil
}

func validKey(key string) error {
	if key == "" {
		return fmt.Errorf("empty key")
	}
	for _, seg := range strings.Split(strings.ReplaceAll(key, ".", "/"), "/") {
		if seg == "" || seg == ".." {
			return fmt.Errorf("malformed key")
		}
	}
	return nil
}

// Write sets each key under root (/proc/sys as the container's namespaces
// see it), in key order.
func Write(root string, sysctl map[string]string) error {
	for _, raw := range sortedKeys(sysctl) {
		p := Path(root, Normalize(raw))
		if err := os.WriteFile(p, []byte(sysctl[raw]), 0o644); err != nil {
			return fmt.Errorf("setting sysctl %q to %q: %w", raw, sysctl[raw], err)
		}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
