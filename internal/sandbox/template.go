package sandbox

import (
	"context"
	"strings"
	"time"

	"github.com/hull-runtime/hull/internal/fsguard"
	"github.com/hull-runtime/hull/internal/network"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/template"
	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu"
)

// templateClone is the template to restore cfg's VM from, built first if
// need be (docs/templates.md); nil when templates are off or none can be
// had, which is said with a warning: the pod then boots.
func (s *Sandbox) templateClone(ctx context.Context, rec *state.Handle, o Options, cfg vm.Config) *template.Clone {
	if !o.Config.Factory.EnableTemplate {
		return nil
	}
	// A clone's QEMU gets its template's memory read-only, or not at all.
	err := fsguard.ReadOnlyOpens()
	var shape template.Shape
	if err == nil {
		shape, err = shapeOf(cfg)
	}
	if err == nil {
		var c *template.Clone
		c, err = template.NewStore(rec.Root(), s.log).Get(ctx, shape)
		if err == nil {
			return c
		}
	}
	s.log.Warn("no VM template; booting the VM", "error", err)
	return nil
}

// shapeOf is the template shape of cfg, with QEMU's defaults filled in
// as it will run (the binary found on PATH, the default firmware, the
// clock hint).
func shapeOf(cfg vm.Config) (template.Shape, error) {
	hv, err := qemu.New(cfg, nil)
	if err != nil {
		return template.Shape{}, err
	}
	c := hv.Config()
	sh := template.Shape{
		QEMU: c.Binary, Kernel: c.Kernel, Initrd: c.Initrd, Firmware: c.Firmware,
		MachineType: c.MachineType, Accel: c.Accel, VCPUs: c.VCPUs, MemoryMiB: c.MemoryMiB,
		KernelParams: c.KernelParams, NICs: len(c.NICs),
	}
	for _, share := range c.Shares {
		sh.ShareTags = append(sh.ShareTags, share.Tag)
	}
	return sh, nil
}

// restoreConfig is cfg restored from clone: its RAM the template's file,
// its devices the template's saved state.
func (s *Sandbox) restoreConfig(cfg vm.Config, clone *template.Clone) vm.Config {
	cfg.Memory = &vm.MemoryFile{Path: clone.MemoryPath}
	cfg.Restore = clone.State
	return cfg
}

// renameClonedNICs tells the agent which NIC is which in a restored VM:
// its NICs kept the template's MACs, NIC i template.PlaceholderMAC(i).
func renameClonedNICs(ep *network.Endpoint) {
	for i, n := range ep.NICs {
		for _, ifc := range ep.Request.GetInterfaces() {
			if strings.EqualFold(ifc.GetMac(), n.MAC.String()) {
				ifc.GuestMac = template.PlaceholderMAC(i).String()
			}
		}
	}
}

// discardClone stops a restored VM whose agent did not answer and drops
// its template, so that the next pod rebuilds it.
func (s *Sandbox) discardClone(ctx context.Context, rec *state.Handle) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	// The guest is not answering: kill QEMU at once.
	if err := s.vm.Stop(sctx, time.Millisecond); err != nil {
		s.log.Warn("stopping the restored VM", "error", err)
	}
	s.vm, s.restored = nil, false
	s.dropTemplate(ctx, rec, s.template)
}

// dropTemplate removes the template key, which made a clone fail.
func (s *Sandbox) dropTemplate(ctx context.Context, rec *state.Handle, key string) {
	if _, err := template.NewStore(rec.Root(), s.log).Remove(ctx, key); err != nil {
		s.log.Warn("removing the VM template that failed", "template", key, "error", err)
	}
}
