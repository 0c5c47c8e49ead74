package portforward

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/hull-runtime/hull/internal/ebpf"
	"golang.org/x/sys/unix"
)

// The steering program, BPF_PROG_TYPE_SK_LOOKUP (Documentation/bpf/
// prog_sk_lookup.rst in the kernel tree): for every TCP connection to
// 127.0.0.1 in the namespace it attaches to, it hands the connection to
// the one listening socket in its SOCKMAP, whatever the port. In C:
//
//	if (ctx->family != AF_INET || ctx->protocol != IPPROTO_TCP ||
//	    ctx->local_ip4 != htonl(INADDR_LOOPBACK))
//		return SK_PASS;
//	__u32 zero = 0;
//	struct bpf_sock *sk = bpf_map_lookup_elem(&listener, &zero);
//	if (!sk)
//		return SK_PASS;
//	bpf_sk_assign(ctx, sk, 0);
//	bpf_sk_release(sk);
//	return SK_PASS;

// Offsets in struct bpf_sk_lookup (include/uapi/linux/bpf.h).
const (
	offFamily   = 8
	offProtocol = 12
	offLocalIP4 = 40
)

// Helper function ids (enum bpf_func_id).
const (
	fnMapLookupElem = 1
	fnSkRelease     = 86
	fnSkAssign      = 124
)

const skPass = 1

func ins(code uint8, dst, src uint8, off int16, imm int32) ebpf.Insn {
	return ebpf.Insn{Code: code, Dst: dst, Src: src, Off: off, Imm: imm}
}

// loopback is 127.0.0.1 as ctx->local_ip4 holds it (network order) read
// as a host-order u32.
var loopback = int32(binary.NativeEndian.Uint32([]byte{127, 0, 0, 1}))

// program assembles the steering program for the SOCKMAP mapFD.
func program(mapFD int) []ebpf.Insn {
	const out = 21 // index of "r0 = SK_PASS"
	p := []ebpf.Insn{
		/* 0 */ ins(ebpf.MovX, 6, 1, 0, 0), // r6 = ctx
		/* 1 */ ins(ebpf.LdxW, 2, 6, offFamily, 0),
		/* 2 */ ins(ebpf.JneK, 2, 0, out-3, unix.AF_INET),
		/* 3 */ ins(ebpf.LdxW, 2, 6, offProtocol, 0),
		/* 4 */ ins(ebpf.JneK, 2, 0, out-5, unix.IPPROTO_TCP),
		/* 5 */ ins(ebpf.LdxW, 2, 6, offLocalIP4, 0),
		/* 6 */ ins(ebpf.JneK, 2, 0, out-7, loopback),
		/* 7 */ ins(ebpf.StW, 10, 0, -4, 0), // key = 0 on the stack
		/* 8 */ ins(ebpf.LdImm64, 1, unix.BPF_PSEUDO_MAP_FD, 0, int32(mapFD)),
		/* 9 */ ins(0, 0, 0, 0, 0),
		/* 10 */ ins(ebpf.MovX, 2, 10, 0, 0),
		/* 11 */ ins(ebpf.AddK, 2, 0, 0, -4),
		/* 12 */ ins(ebpf.Call, 0, 0, 0, fnMapLookupElem),
		/* 13 */ ins(ebpf.JeqK, 0, 0, out-14, 0),
		/* 14 */ ins(ebpf.MovX, 7, 0, 0, 0), // r7 = sk
		/* 15 */ ins(ebpf.MovX, 1, 6, 0, 0),
		/* 16 */ ins(ebpf.MovX, 2, 7, 0, 0),
		/* 17 */ ins(ebpf.MovK, 3, 0, 0, 0),
		/* 18 */ ins(ebpf.Call, 0, 0, 0, fnSkAssign),
		/* 19 */ ins(ebpf.MovX, 1, 7, 0, 0),
		/* 20 */ ins(ebpf.Call, 0, 0, 0, fnSkRelease),
		/* 21 */ ins(ebpf.MovK, 0, 0, 0, skPass),
		/* 22 */ ins(ebpf.Exit, 0, 0, 0, 0),
	}
	return p
}

// newSockmap creates a one-entry SOCKMAP.
func newSockmap() (int, error) {
	attr := struct {
		mapType, keySize, valueSize, maxEntries, flags uint32
	}{unix.BPF_MAP_TYPE_SOCKMAP, 4, 8, 1, 0}
	// bpf(BPF_MAP_CREATE, {BPF_MAP_TYPE_SOCKMAP, key 4, value 8, 1 entry})
	fd, err := ebpf.Syscall(unix.BPF_MAP_CREATE, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	if err != nil {
		return -1, fmt.Errorf("creating the listener's sockmap: %w", err)
	}
	unix.CloseOnExec(fd)
	return fd, nil
}

// sockmapSet puts the socket sockFD at key 0 of the SOCKMAP mapFD.
func sockmapSet(mapFD, sockFD int) error {
	key := uint32(0)
	value := uint64(sockFD)
	attr := struct {
		mapFD, _   uint32
		key, value uint64
		flags      uint64
	}{mapFD: uint32(mapFD), key: uint64(uintptr(unsafe.Pointer(&key))), value: uint64(uintptr(unsafe.Pointer(&value))), flags: unix.BPF_ANY}
	// bpf(BPF_MAP_UPDATE_ELEM, {map, &0, &sockfd, BPF_ANY})
	_, err := ebpf.Syscall(unix.BPF_MAP_UPDATE_ELEM, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	runtime.KeepAlive(&key)
	runtime.KeepAlive(&value)
	if err != nil {
		return fmt.Errorf("putting the listener in its sockmap: %w", err)
	}
	return nil
}

// loadProgram loads the steering program; on a verifier error the
// verifier's log comes with it.
func loadProgram(mapFD int) (int, error) {
	// bpf(BPF_PROG_LOAD, {BPF_PROG_TYPE_SK_LOOKUP, program, "GPL", BPF_SK_LOOKUP})
	return ebpf.Load(unix.BPF_PROG_TYPE_SK_LOOKUP, unix.BPF_SK_LOOKUP, "hull_portfwd", program(mapFD))
}

// attach links the program to the network namespace netnsFD; the program
// stays attached exactly as long as the returned link descriptor is open.
func attach(progFD, netnsFD int) (int, error) {
	attr := struct {
		progFD, targetFD, attachType, flags uint32
	}{uint32(progFD), uint32(netnsFD), unix.BPF_SK_LOOKUP, 0}
	// bpf(BPF_LINK_CREATE, {prog, netns, BPF_SK_LOOKUP})
	fd, err := ebpf.Syscall(unix.BPF_LINK_CREATE, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	if err != nil {
		return -1, fmt.Errorf("attaching the sk_lookup program: %w", err)
	}
	unix.CloseOnExec(fd)
	return fd, nil
}

// AttachedPrograms counts the sk_lookup programs attached to the network
// namespace nsFD (for leak checks: Hull's is gone once its shim is).
func AttachedPrograms(nsFD int) (int, error) {
	attr := struct {
		targetFD, attachType, queryFlags, attachFlags uint32
		progIDs                                       uint64
		progCnt                                       uint32
		_                                             uint32
	}{targetFD: uint32(nsFD), attachType: unix.BPF_SK_LOOKUP}
	// bpf(BPF_PROG_QUERY, {netns, BPF_SK_LOOKUP}), as `bpftool net` asks
	if _, err := ebpf.Syscall(unix.BPF_PROG_QUERY, unsafe.Pointer(&attr), unsafe.Sizeof(attr)); err != nil {
		return 0, fmt.Errorf("querying the sk_lookup programs of a network namespace: %w", err)
	}
	return int(attr.progCnt), nil
}
