package harness

import (
	"fmt"
	"path/filepath"
	"strings"
)

// disabledPlugins are plugins the test containerd does not need (and
// some cannot start here).
const disabledPlugins = `["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]`

// configHead is what both configuration versions start with: paths,
// sockets, debug logging, the plugins left out.
func (c *Containerd) configHead(b *strings.Builder, version int) {
	fmt.Fprintf(b, `version = %d
root = %q
state = %q
disabled_plugins = %s

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  level = "debug"

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, version, c.Root, c.State, disabledPlugins, c.Socket, c.TTRPCSocket, filepath.Join(c.Dir, "opt"))
}

// configV2 is containerd 1.x's configuration (version 2): CRI is one
// plugin, io.containerd.grpc.v1.cri.
func (c *Containerd) configV2(b *strings.Builder) {
	c.configHead(b, 2)
	fmt.Fprintf(b, `
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = %q
  conf_dir = %q
  max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

`, PauseImage,
		c.cniBinDir(), c.CNIConfDir)
}

// configV3 is containerd 2.x's configuration (version 3), the same
// settings as configV2: CRI's server (streaming) stays in
// io.containerd.grpc.v1.cri, images (snapshotter, the pinned sandbox
// image) move to io.containerd.cri.v1.images, runtimes, CNI and the OOM
// score setting to io.containerd.cri.v1.runtime. containerd 2.x would
// migrate a version 2 file on every start; version 3 is what its users
// write (deploy/containerd-hull-v3.toml).
func (c *Containerd) configV3(b *strings.Builder) {
	c.configHead(b, 3)
	fmt.Fprintf(b, `
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = %q

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  disable_apparmor = true

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = [%q]
  conf_dir = %q
  max_conf_num = 1

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

`, PauseImage,
		c.cniBinDir(), c.CNIConfDir)
}
