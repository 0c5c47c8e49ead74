package state

import (
	"path/filepath"
	"strconv"

	"github.com/hull-runtime/hull/internal/hostfs"
)

// Data keys of mounts and directories in a sandbox's tree (schema 1 gains
// them as optional fields: a record without them is released as before,
// by its path with no symlink followed).
const (
	// DataAnchor is the trusted directory (one the guest never writes)
	// a dir's or mount's path is resolved beneath, with no symlink
	// followed and no escape.
	DataAnchor = "anchor"
	// DataMountID is the unique mount id (statx STATX_MNT_ID_UNIQUE) of
	// a mount, recorded once it is made; release unmounts that mount,
	// wherever it is, and nothing else. "0" on kernels before 6.8, where
	// the mountinfo id with the root's dev and inode name it.
	DataMountID = "mnt_id"
	// DataMountIDOld is its /proc/self/mountinfo id (a reusable hint).
	DataMountIDOld = "mnt_id_old"
	// DataDev and DataIno are the device and inode of the mount's root.
	DataDev = "dev"
	DataIno = "ino"
)

// Anchored returns r with its path to be resolved beneath anchor.
func Anchored(r Resource, anchor string) Resource {
	r.Data = cloneData(r.Data)
	r.Data[DataAnchor] = anchor
	return r
}

// WithMountIdentity returns r with the identity of the mount it names.
func WithMountIdentity(r Resource, id hostfs.Identity) Resource {
	r.Data = cloneData(r.Data)
	r.Data[DataMountID] = strconv.FormatUint(id.ID, 10)
	r.Data[DataMountIDOld] = strconv.FormatUint(id.OldID, 10)
	r.Data[DataDev] = strconv.FormatUint(id.Dev, 10)
	r.Data[DataIno] = strconv.FormatUint(id.Ino, 10)
	return r
}

// mountIdentity returns the identity recorded for a mount, if any.
func (r Resource) mountIdentity() (hostfs.Identity, bool) {
	var id hostfs.Identity
	var err error
	if id.OldID, err = strconv.ParseUint(r.Data[DataMountIDOld], 10, 64); err != nil || id.OldID == 0 {
		return hostfs.Identity{}, false
	}
	id.ID, _ = strconv.ParseUint(r.Data[DataMountID], 10, 64)
	id.Dev, _ = strconv.ParseUint(r.Data[DataDev], 10, 64)
	id.Ino, _ = strconv.ParseUint(r.Data[DataIno], 10, 64)
	return id, true
}

// anchor returns the trusted directory r's path is resolved beneath and
// the path relative to it. A record without one (written before anchors
// existed) has its parent directory as anchor.
func (r Resource) anchor() (string, string, error) {
	p := r.path()
	a := r.Data[DataAnchor]
	if a == "" {
		a = filepath.Dir(p)
	}
	rel, err := hostfs.Rel(a, p)
	return a, rel, err
}

func cloneData(d map[string]string) map[string]string {
	out := make(map[string]string, len(d)+5)
	for k, v := range d {
		out[k] = v
	}
	return out
}
