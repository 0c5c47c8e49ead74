package caps

import (
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestParse(t *testing.T) {
	s, err := Parse("bounding", []string{"CAP_CHOWN", "CAP_NET_ADMIN", "CAP_CHECKPOINT_RESTORE"}, 40)
	if err != nil {
		t.Fatal(err)
	}
	if want := Set(1<<0 | 1<<12 | 1<<40); s != want {
		t.Errorf("got %#x, want %#x", s, want)
	}
	if got := strings.Join(s.Names(), ","); got != "CAP_CHOWN,CAP_NET_ADMIN,CAP_CHECKPOINT_RESTORE" {
		t.Errorf("names: %s", got)
	}
	// Above the kernel's last capability: left out.
	s, err = Parse("bounding", []string{"CAP_BPF", "CAP_CHECKPOINT_RESTORE"}, 38)
	if err != nil || s != 0 {
		t.Errorf("above last: %#x, %v", s, err)
	}
	if _, err := Parse("capabilities.effective", []string{"CAP_CHOWN", "CAP_FLY"}, 40); err == nil ||
		!strings.Contains(err.Error(), `"CAP_FLY"`) || !strings.Contains(err.Error(), "capabilities.effective") {
		t.Errorf("unknown name: %v", err)
	}
}

func TestParseAll(t *testing.T) {
	s, err := ParseAll(&specs.LinuxCapabilities{
		Bounding: []string{"CAP_KILL", "CAP_NET_ADMIN"}, Effective: []string{"CAP_KILL"},
		Permitted: []string{"CAP_KILL"}, Inheritable: []string{"CAP_NET_ADMIN"}, Ambient: []string{"CAP_NET_ADMIN"},
	}, 40)
	if err != nil {
		t.Fatal(err)
	}
	want := Sets{Bounding: 1<<5 | 1<<12, Effective: 1 << 5, Permitted: 1 << 5, Inheritable: 1 << 12, Ambient: 1 << 12}
	if s != want {
		t.Errorf("got %+v, want %+v", s, want)
	}
	if _, err := ParseAll(&specs.LinuxCapabilities{Ambient: []string{"NET_ADMIN"}}, 40); err == nil || !strings.Contains(err.Error(), "capabilities.ambient") {
		t.Errorf("want an error naming the set: %v", err)
	}
}

func TestNamesMatchKernel(t *testing.T) {
	if len(names) != 41 || names[12] != "CAP_NET_ADMIN" || names[21] != "CAP_SYS_ADMIN" || names[40] != "CAP_CHECKPOINT_RESTORE" {
		t.Fatal("capability table out of order")
	}
	if l := LastCap(); l < 36 || l > 40 {
		t.Errorf("LastCap %d", l)
	}
}
