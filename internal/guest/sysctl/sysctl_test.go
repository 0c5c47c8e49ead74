package sysctl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestValidate(t *testing.T) {
	pod := []specs.LinuxNamespace{
		{Type: specs.IPCNamespace, Path: "/proc/1/ns/ipc"}, {Type: specs.NetworkNamespace, Path: "/var/run/netns/x"},
		{Type: specs.UTSNamespace},
	}
	own := []specs.LinuxNamespace{{Type: specs.IPCNamespace}, {Type: specs.NetworkNamespace}}
	for _, c := range []struct {
		key  string
		nss  []specs.LinuxNamespace
		want string // "" for allowed
	}{
		{"kernel.shm_rmid_forced", pod, ""},
		{"kernel.shm_rmid_forced", own, ""},
		{"kernel.msgmax", own, ""},
		{"kernel.sem", own, ""},
		{"fs.mqueue.msg_max", own, ""},
		{"net.ipv4.ip_forward", pod, ""},
		{"net/ipv4/conf/eth0.100/forwarding", own, ""},
		{"kernel.domainname", pod, ""},
		{"kernel.shm_rmid_forced", nil, "ipc namespace"},
		{"net.core.somaxconn", []specs.LinuxNamespace{{Type: specs.IPCNamespace}}, "network namespace"},
		{"kernel.hostname", pod, "conflicts"},
		{"kernel.domainname", own, "not in a separate kernel namespace"},
		{"vm.overcommit_memory", pod, "not in a separate kernel namespace"},
		{"kernel.pid_max", pod, "not in a separate kernel namespace"},
		{"net.ipv4..x", own, "malformed"},
		{"net/../../kernel/x", own, "malformed"},
	} {
		err := Validate(map[string]string{c.key: "1"}, c.nss)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.key, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `"`+c.key+`"`)):
			t.Errorf("%s: got %v, want an error naming the key and %q", c.key, err, c.want)
		}
	}
}

func TestWrite(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"kernel", "net/ipv4/conf/eth0.100"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	err := Write(root, map[string]string{"kernel.shm_rmid_forced": "1", "net/ipv4/conf/eth0.100/forwarding": "0"})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"kernel/shm_rmid_forced": "1", "net/ipv4/conf/eth0.100/forwarding": "0"} {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil || string(b) != want {
			t.Errorf("%s: %q, %v", p, b, err)
		}
	}
	if err := Write(root, map[string]string{"kernel.nope.x": "1"}); err == nil || !strings.Contains(err.Error(), `"kernel.nope.x"`) {
		t.Errorf("missing key: %v", err)
	}
}
