// Package hostcheck probes the host for what Hull needs: QEMU, KVM (or the
// TCG fallback), vsock, Landlock, templates, tap, tc and macvtap support, the cgroup version,
// the guest kernel and initramfs, and containerd. Probes only look: they
// open device nodes and read files, and create nothing that outlives them.
package hostcheck

import (
	"context"

	"github.com/hull-runtime/hull/internal/config"
)

// Result is the outcome of one probe.
type Result struct {
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Required results that are not OK keep Hull from running; others
	// are degraded modes (TCG instead of KVM, virtio-serial instead of vsock).
	Required bool   `json:"required"`
	Detail   string `json:"detail"`
	Fix      string `json:"fix,omitempty"`
}

// Report is everything the probes found.
type Report struct {
	QEMU       QEMUInfo   `json:"qemu"`
	Kernel     KernelInfo `json:"kernel"`
	Initrd     InitrdInfo `json:"initrd"`
	KVM        bool       `json:"kvm"`
	Accel      string     `json:"accel"` // "kvm" or "tcg"
	Cgroup     string     `json:"cgroup"`
	Containerd string     `json:"containerd,omitempty"` // version, "" when not found
	Results    []Result   `json:"results"`
}

// Failed returns the required results that are not OK.
func (r *Report) Failed() []Result {
	var out []Result
	for _, res := range r.Results {
		if res.Required && !res.OK {
			out = append(out, res)
		}
	}
	return out
}

// Check runs every probe for the configuration cfg.
func Check(ctx context.Context, cfg *config.Config) *Report {
	h := cfg.Hypervisor
	r := &Report{}
	add := func(res Result, required bool) {
		res.Required = required
		r.Results = append(r.Results, res)
	}

	var res Result
	r.QEMU, res = QEMU(ctx, h.Path)
	add(res, true)
	r.Kernel, res = Kernel(h.Kernel)
	add(res, true)
	r.Initrd, res = Initrd(h.Initrd)
	add(res, true)
	if h.Firmware != "" {
		add(fileProbe("firmware", h.Firmware, "install the firmware image or set hypervisor.qemu.firmware = \"\""), true)
	}
	if h.SharedFS == "virtio-fs" {
		add(fileProbe("virtiofsd", h.VirtioFSDaemon,
			"apt-get install qemu-system-common (Debian 12 ships /usr/lib/qemu/virtiofsd), or set hypervisor.qemu.shared_fs = \"virtio-9p\""), true)
	}

	res = KVM()
	r.KVM = res.OK
	r.Accel = "tcg"
	if res.OK {
		r.Accel = "kvm"
	}
	add(res, false)
	add(Vsock(), false)
	add(Landlock(), false)
	add(Templates(cfg.Factory.EnableTemplate), false)
	add(Tap(), true)
	model := cfg.Runtime.InternetworkingModel
	add(TC(), model == config.NetTCFilter)
	add(Macvtap(), model == config.NetMacvtap)
	r.Cgroup, res = Cgroup()
	add(res, false)
	r.Containerd, res = Containerd(ctx)
	add(res, false)
	return r
}
