package nsinit

import "sort"

// MountOptionNames lists the fstab-style mount options the helper turns
// into mount flags itself (ParseMountOptions), propagation included: what
// the shim advertises as the runtime's features. Any other option is passed
// to the filesystem as data.
func MountOptionNames() []string {
	names := make([]string, 0, len(mountFlags)+len(propagationFlags))
	for n := range mountFlags {
		names = append(names, n)
	}
	for n := range propagationFlags {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
