package channel

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestFromHost(t *testing.T) {
	for _, c := range []struct {
		sa   unix.Sockaddr
		want bool
	}{
		{&unix.SockaddrVM{CID: unix.VMADDR_CID_HOST, Port: 1234}, true},
		{&unix.SockaddrVM{CID: unix.VMADDR_CID_LOCAL, Port: 1234}, false},
		{&unix.SockaddrVM{CID: 3, Port: 1234}, false},
		{&unix.SockaddrVM{CID: unix.VMADDR_CID_ANY}, false},
		{&unix.SockaddrUnix{Name: "x"}, false},
		{nil, false},
	} {
		if got := fromHost(c.sa); got != c.want {
			t.Errorf("%+v: got %v", c.sa, got)
		}
	}
}
