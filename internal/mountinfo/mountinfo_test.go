package mountinfo

import (
	"strings"
	"testing"
)

const sample = `22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw
36 35 98:0 /mnt1 /mnt\0402 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
40 36 0:33 / /mnt\0402/sub rw shared:7 master:2 - tmpfs tmp\134x rw,size=1024k
bad line
41 36 0:34 / /other rw - tmpfs none
`

func TestParse(t *testing.T) {
	ms, err := Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 4 {
		t.Fatalf("%d mounts: %+v", len(ms), ms)
	}
	m := ms[1]
	if m.ID != 36 || m.Parent != 35 || m.Dev != "98:0" || m.Root != "/mnt1" || m.MountPoint != "/mnt 2" ||
		m.Options != "rw,noatime" || len(m.Optional) != 1 || m.Optional[0] != "master:1" ||
		m.FSType != "ext3" || m.Source != "/dev/root" || m.SuperOptions != "rw,errors=continue" {
		t.Errorf("mount 36: %+v", m)
	}
	if ms[2].Source != `tmp\x` || len(ms[2].Optional) != 2 {
		t.Errorf("mount 40: %+v", ms[2])
	}
	if ms[3].SuperOptions != "" || ms[3].Source != "none" {
		t.Errorf("mount 41 without super options: %+v", ms[3])
	}
	if got := strings.Join(Under(ms, "/mnt 2"), ","); got != "/mnt 2,/mnt 2/sub" {
		t.Errorf("Under = %q", got)
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`a\040b`: "a b", `\011x`: "\tx", `x\134`: `x\`, `no\escape`: `no\escape`, `end\04`: `end\04`, "plain": "plain"} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReadSelf(t *testing.T) {
	ms, err := Read()
	if err != nil || len(ms) == 0 {
		t.Fatalf("Read: %d mounts, %v", len(ms), err)
	}
	if len(Under(ms, "/")) != len(ms) {
		t.Error("not every mount is under /")
	}
}
