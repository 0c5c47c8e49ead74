package nsinit

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ModeAhead is the argument (after Arg) of a helper started before its
// container exists (docs/performance.md, "The helper started ahead"). It
// is born in a pid namespace of its own, as a session leader, with one
// end of a unix socket pair on ConfigFD and /dev/null elsewhere. It says
// it waits with one byte on that socket, then receives AheadFDs
// descriptors in one message (stdin, stdout, stderr, config, sync,
// start), puts each on its number and goes on in create mode: its
// Config's Unshare names the other namespaces, made on its thread.
const ModeAhead = "ahead"

// AheadFDs is how many descriptors a helper started ahead receives: fds
// 0 to 5 of a created helper.
const AheadFDs = 6

func startedAhead() bool { return len(os.Args) > 2 && os.Args[2] == ModeAhead }

// awaitFDs says the helper waits, then receives its descriptors and puts
// each on its number (the socket on ConfigFD is replaced by the config
// pipe).
func awaitFDs() error {
	if _, err := unix.Write(ConfigFD, []byte{0}); err != nil {
		return fmt.Errorf("saying it waits: %w", err)
	}
	var b [1]byte
	oob := make([]byte, unix.CmsgSpace(AheadFDs*4))
	_, oobn, _, _, err := unix.Recvmsg(ConfigFD, b[:], oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return fmt.Errorf("receiving descriptors: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return fmt.Errorf("receiving descriptors: %d control messages (%v)", len(msgs), err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil {
		return fmt.Errorf("receiving descriptors: %w", err)
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if len(fds) != AheadFDs {
		return fmt.Errorf("received %d descriptors, want %d", len(fds), AheadFDs)
	}
	for i, fd := range fds {
		// fds 0 to 5 are taken, so a received one is above them
		if err := unix.Dup3(fd, i, 0); err != nil {
			return fmt.Errorf("placing descriptor %d: %w", i, err)
		}
	}
	return nil
}
