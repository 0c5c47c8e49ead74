package qemu

import (
	"os"
	"path/filepath"

	"github.com/hull-runtime/hull/internal/fsguard"
	"github.com/hull-runtime/hull/internal/vm"
)

// policy is what QEMU may reach of the host's files (internal/fsguard,
// docs/security.md "QEMU confinement"): what it opens while it starts,
// each share as the guest may use it, and nothing else, on a root of
// its own built on root. Nothing in its own directory, which it starts
// in (empty in that root): its sockets, log and console are
// descriptors the host passes, and the sandbox's records there are not
// QEMU's to read. accel is the resolved accelerator.
func policy(cfg vm.Config, accel, root string) fsguard.Policy {
	rules := []fsguard.Rule{
		{Path: "/usr", Access: fsguard.Exec}, // QEMU, its libraries, firmware and option ROMs
		{Path: "/etc/ld.so.cache", Access: fsguard.Read},
		{Path: "/dev/null", Access: fsguard.Write},
		{Path: "/dev/urandom", Access: fsguard.Read}, // rng-random
		{Path: cfg.Binary, Access: fsguard.Exec},
		{Path: cfg.Kernel, Access: fsguard.Read},
	}
	// A QEMU installed elsewhere than /usr (/opt/qemu/bin/qemu-…) has its
	// libraries and data beside its bin.
	if bin := filepath.Dir(cfg.Binary); filepath.Base(bin) == "bin" && filepath.Dir(bin) != "/" && filepath.Dir(bin) != "/usr" {
		prefix := filepath.Dir(bin)
		rules = append(rules, fsguard.Rule{Path: prefix, Access: fsguard.Exec})
	}
	// Hosts without a merged /usr keep libraries in /lib* (where they are
	// symlinks into /usr, the rule above covers them).
	for _, d := range []string{"/lib", "/lib64"} {
		if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
			rules = append(rules, fsguard.Rule{Path: d, Access: fsguard.Exec})
		}
	}
	if accel == AccelKVM {
		rules = append(rules, fsguard.Rule{Path: "/dev/kvm", Access: fsguard.Write})
	}
	if cfg.Firmware != "" {
		rules = append(rules, fsguard.Rule{Path: cfg.Firmware, Access: fsguard.Read})
	}
	if cfg.Initrd != "" {
		rules = append(rules, fsguard.Rule{Path: cfg.Initrd, Access: fsguard.Read})
	}
	for _, s := range cfg.Shares {
		a := fsguard.Own
		if s.ReadOnly {
			a = fsguard.Read
		}
		rules = append(rules, fsguard.Rule{Path: s.HostPath, Access: a})
	}
	p := fsguard.Policy{Root: root, Workdir: cfg.Dir}
	if m := cfg.Memory; m != nil {
		// A build sizes and writes its template's file. A clone's QEMU
		// 7.2 opens it for writing too but only maps it privately: it
		// is bound read-only, and that open is answered with a
		// read-only descriptor (fsguard.Policy.ReadOnlyOpens), so that
		// a fallen clone cannot change what the others map.
		if m.Shared {
			rules = append(rules, fsguard.Rule{Path: m.Path, Access: fsguard.Own})
		} else {
			rules = append(rules, fsguard.Rule{Path: m.Path, Access: fsguard.Read})
			p.ReadOnlyOpens = []string{m.Path}
		}
	}
	p.Rules = rules
	return p
}
