package shim

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/containerd/containerd/api/types"
	"github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-spec/specs-go/features"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/hull-runtime/hull/internal/cli"
)

// featuresTypeURL is the type URL containerd 2.x registers for the OCI
// runtime features document (client.go and core/runtime/typeurl.go of
// containerd/v2): the Any carries the document as JSON.
const featuresTypeURL = "types.containerd.io/opencontainers/runtime-spec/1/features/Features"

// RuntimeInfo is what `containerd-shim-hull-v2 -info` prints: the shim's
// name and version and the OCI features the guest implements, as runc's
// shim reports `runc features`. containerd 2.x asks for it at CRI startup
// (to decide recursive read-only mounts and user namespaces for the
// handler) and, for a shim whose bootstrap result carries no mount
// capabilities, at every task create.
func RuntimeInfo() (*types.RuntimeInfo, error) {
	doc, err := json.Marshal(ociFeatures())
	if err != nil {
		return nil, fmt.Errorf("encoding the runtime features: %w", err)
	}
	return &types.RuntimeInfo{
		Name:     RuntimeName,
		Version:  &types.RuntimeVersion{Version: cli.Version, Revision: cli.Commit},
		Features: &anypb.Any{TypeUrl: featuresTypeURL, Value: doc},
	}, nil
}

// guestMountOptions are the mount options the guest's container helper
// turns into mount flags itself (internal/guest/nsinit's table; a test
// keeps the two equal: the shim links no guest code). "rro" among them:
// recursively read-only on the host and in the guest.
var guestMountOptions = []string{
	"async", "atime", "bind", "dev", "diratime", "dirsync", "exec", "mand", "noatime", "nodev",
	"nodiratime", "noexec", "nomand", "norelatime", "nosuid", "private", "rbind", "relatime",
	"remount", "ro", "rprivate", "rro", "rshared", "rslave", "runbindable", "rw", "shared", "slave",
	"strictatime", "suid", "sync", "unbindable",
}

// ociFeatures is the features document of the guest's container helper.
// Not listed, because the guest does not do them: the user namespace and
// idmapped mounts — containerd then advertises neither for Hull's
// handler and CRI clients skip what needs them.
func ociFeatures() *features.Features {
	no := false
	return &features.Features{
		OCIVersionMin: "1.0.0",
		OCIVersionMax: specs.Version,
		MountOptions:  slices.Clone(guestMountOptions),
		Linux: &features.Linux{
			Namespaces: []string{"ipc", "mount", "network", "pid", "uts"},
			MountExtensions: &features.MountExtensions{
				IDMap: &features.IDMap{Enabled: &no},
			},
		},
	}
}

// writeRuntimeInfo answers `-info`: containerd writes the runtime's
// options on stdin (read and ignored: Hull has none), and reads a
// RuntimeInfo protobuf from stdout.
func writeRuntimeInfo(stdin io.Reader, stdout io.Writer) error {
	if _, err := io.Copy(io.Discard, io.LimitReader(stdin, 10<<20)); err != nil {
		return fmt.Errorf("reading runtime options from stdin: %w", err)
	}
	info, err := RuntimeInfo()
	if err != nil {
		return err
	}
	b, err := proto.Marshal(info)
	if err != nil {
		return fmt.Errorf("encoding the runtime info: %w", err)
	}
	_, err = stdout.Write(b)
	return err
}

// runInfo is the whole process for `-info`.
func runInfo() {
	if err := writeRuntimeInfo(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s\n", RuntimeName, err)
		os.Exit(1)
	}
	os.Exit(0)
}
