package agent

import (
	"encoding/binary"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
)

// maxPingEntropy bounds PingRequest.entropy: 4 KiB is far more than the
// 32 bytes a CRNG reseed needs, and keeps a request from making the
// kernel hash megabytes.
const maxPingEntropy = 4096

// bootIDPath is the guest kernel's boot id, which Ping reports.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// pingSys holds the system calls Ping makes, so that a test can record
// their order without touching the host's RNG or clock. A nil field is the
// real call.
type pingSys struct {
	// addEntropy mixes b into the kernel's input pool, crediting len(b)*8 bits.
	addEntropy func(b []byte) error
	// reseedCRNG makes the kernel's CRNG take a new key from the pool now,
	// rather than at its next scheduled reseed.
	reseedCRNG func() error
	// setClock steps CLOCK_REALTIME to unixNs.
	setClock func(unixNs int64) error
	// stepClock moves CLOCK_REALTIME by deltaNs.
	stepClock func(deltaNs int64) error
	// now reads CLOCK_REALTIME in Unix nanoseconds.
	now func() int64
	// readBootID reads the kernel's boot id.
	readBootID func() ([]byte, error)
}

// withDefaults returns p with every nil field set to the real call.
func (p pingSys) withDefaults() pingSys {
	if p.addEntropy == nil {
		p.addEntropy = addEntropy
	}
	if p.reseedCRNG == nil {
		p.reseedCRNG = reseedCRNG
	}
	if p.setClock == nil {
		p.setClock = setClock
	}
	if p.stepClock == nil {
		p.stepClock = stepClock
	}
	if p.now == nil {
		p.now = func() int64 { return time.Now().UnixNano() }
	}
	if p.readBootID == nil {
		p.readBootID = func() ([]byte, error) { return os.ReadFile(bootIDPath) }
	}
	return p
}

// takeHostState makes a guest restored from a template stop sharing state
// with its siblings: it mixes the host's entropy into the kernel's pool,
// reseeds the CRNG from it, and steps the wall clock to the host's time
// or by the host's correction. An empty request changes nothing. The
// error is a ttrpc status: the request is invalid (InvalidArgument) or a
// step failed (Internal, naming it).
func takeHostState(sys pingSys, r *agentapi.PingRequest) error {
	entropy, hostNs, stepNs := r.GetEntropy(), r.GetHostTimeUnixNs(), r.GetClockStepNs()
	if len(entropy) > maxPingEntropy {
		return status.Errorf(codes.InvalidArgument, "entropy of %d bytes is longer than %d", len(entropy), maxPingEntropy)
	}
	if hostNs < 0 {
		return status.Errorf(codes.InvalidArgument, "host time %d ns is before 1970", hostNs)
	}
	if hostNs != 0 && stepNs != 0 {
		return status.Errorf(codes.InvalidArgument, "host time %d ns and clock step %d ns in one request: send one", hostNs, stepNs)
	}
	if len(entropy) > 0 {
		if err := sys.addEntropy(entropy); err != nil {
			return status.Errorf(codes.Internal, "adding host entropy: %v", err)
		}
		if err := sys.reseedCRNG(); err != nil {
			return status.Errorf(codes.Internal, "reseeding the CRNG: %v", err)
		}
	}
	if hostNs != 0 {
		if err := sys.setClock(hostNs); err != nil {
			return status.Errorf(codes.Internal, "setting the clock: %v", err)
		}
	}
	if stepNs != 0 {
		if err := sys.stepClock(stepNs); err != nil {
			return status.Errorf(codes.Internal, "stepping the clock by %d ns: %v", stepNs, err)
		}
	}
	return nil
}

// randPoolInfo encodes b as the kernel's struct rand_pool_info, the
// argument of RNDADDENTROPY: int entropy_count (bits credited), int
// buf_size (bytes), then the bytes, in the machine's byte order.
func randPoolInfo(b []byte) []byte {
	buf := make([]byte, 8+len(b))
	binary.NativeEndian.PutUint32(buf[0:4], uint32(len(b)*8))
	binary.NativeEndian.PutUint32(buf[4:8], uint32(len(b)))
	copy(buf[8:], b)
	return buf
}

// addEntropy is ioctl(open("/dev/random"), RNDADDENTROPY, rand_pool_info).
// Unlike a write to /dev/random it credits the bits, so the kernel counts
// the pool as seeded by them. It needs CAP_SYS_ADMIN.
func addEntropy(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	info := randPoolInfo(b)
	return randomIoctl(unix.RNDADDENTROPY, unsafe.Pointer(&info[0]))
}

// reseedCRNG is ioctl(open("/dev/random"), RNDRESEEDCRNG): without it the
// CRNG keeps the key it (and every clone of the template) already had
// until its next periodic reseed. It needs CAP_SYS_ADMIN.
func reseedCRNG() error {
	return randomIoctl(unix.RNDRESEEDCRNG, nil)
}

// randomIoctl makes the ioctl req with argument arg on /dev/random. arg
// stays an unsafe.Pointer until the system call, so that what it points
// to is kept alive until then.
func randomIoctl(req uint, arg unsafe.Pointer) error {
	f, err := os.OpenFile("/dev/random", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	sc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("/dev/random: %w", err)
	}
	var errno unix.Errno
	if err := sc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, uintptr(req), uintptr(arg))
	}); err != nil {
		return fmt.Errorf("/dev/random: %w", err)
	}
	if errno != 0 {
		return fmt.Errorf("ioctl %#x on /dev/random: %w", req, errno)
	}
	return nil
}

// setClock is clock_settime(CLOCK_REALTIME, unixNs): a step, as `date -s`
// does; a restored template's clock is behind by however long it was
// stored, far more than NTP would slew.
func setClock(unixNs int64) error {
	ts := unix.NsecToTimespec(unixNs)
	return unix.ClockSettime(unix.CLOCK_REALTIME, &ts)
}

// stepClock is clock_adjtime(CLOCK_REALTIME, ADJ_SETOFFSET|ADJ_NANO):
// the kernel adds deltaNs to the clock as it stands when the call runs,
// so the step is exact however long the request took to arrive.
func stepClock(deltaNs int64) error {
	tx := setOffset(deltaNs)
	_, err := unix.ClockAdjtime(unix.CLOCK_REALTIME, &tx)
	return err
}

// setOffset is the timex of a relative step by deltaNs: its time is a
// timeval whose usec field holds nanoseconds (ADJ_NANO) and must not be
// negative, so -1.5 s is {-2 s, 500000000 ns}.
func setOffset(deltaNs int64) unix.Timex {
	sec, ns := deltaNs/1e9, deltaNs%1e9
	if ns < 0 {
		sec, ns = sec-1, ns+1e9
	}
	return unix.Timex{Modes: unix.ADJ_SETOFFSET | unix.ADJ_NANO, Time: unix.Timeval{Sec: sec, Usec: ns}}
}
