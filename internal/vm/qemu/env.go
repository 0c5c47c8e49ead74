package qemu

// Environment is QEMU's whole environment: a fixed PATH and nothing of
// its caller's. A shim started by containerd inherits containerd's
// LD_LIBRARY_PATH (its opt plugin appends a lib directory after an empty
// element, which the dynamic loader reads as the working directory), and
// a QEMU that inherited it looked for each of its ≈ 100 shared libraries
// in containerd's directory and in its working directory, the VM's,
// before the system's (≈ 870 failed opens per start): a library search
// path Hull did not choose. A QEMU that needs more than this (a build of
// its own with its own libraries) is given a wrapper script as its path.
func Environment() []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
}
