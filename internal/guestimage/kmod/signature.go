package kmod

import "bytes"

// sigMagic ends a module that carries an appended signature (see the
// kernel's scripts/sign-file): contents, signature, a 12-byte
// struct module_signature whose last 4 bytes are the big-endian signature
// length, then this magic.
const sigMagic = "~Module signature appended~\n"

// StripSignature returns the module without its appended signature, and
// whether it had one. The guest kernel does not enforce signatures
// (module.sig_enforce is off), and checking 31 RSA signatures costs about
// 120 ms of every boot under TCG.
func StripSignature(ko []byte) ([]byte, bool) {
	if !bytes.HasSuffix(ko, []byte(sigMagic)) {
		return ko, false
	}
	end := len(ko) - len(sigMagic)
	if end < 12 {
		return ko, false
	}
	info := ko[end-12 : end]
	sigLen := int(info[8])<<24 | int(info[9])<<16 | int(info[10])<<8 | int(info[11])
	start := end - 12 - sigLen
	if start < 0 {
		return ko, false
	}
	return ko[:start], true
}
