package qemu

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu/qmp"
)

// fakeQMP is the QEMU side of a QMP connection that answers every
// command, records the sequence, and emits DEVICE_DELETED after each
// device_del, as QEMU does once the guest has let go.
type fakeQMP struct {
	t    *testing.T
	conn *net.UnixConn
	// fail makes the named command fail with this error class.
	fail map[string]string

	mu   sync.Mutex
	cmds []string // "execute {arguments}", with "+fd" when a descriptor came along
}

type fakeCmd struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id"`
}

func (s *fakeQMP) send(v any) {
	b, _ := json.Marshal(v)
	s.conn.Write(append(b, '\r', '\n'))
}

func (s *fakeQMP) serve() {
	s.send(map[string]any{"QMP": map[string]any{"version": map[string]any{"qemu": map[string]int{"major": 7, "minor": 2}}, "capabilities": []string{}}})
	buf := make([]byte, 65536)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			return
		}
		var c fakeCmd
		if err := json.Unmarshal(buf[:n], &c); err != nil {
			s.t.Errorf("fake qmp: decoding %q: %v", buf[:n], err)
			return
		}
		line := c.Execute
		if len(c.Arguments) > 0 {
			line += " " + string(c.Arguments)
		}
		if oobn > 0 {
			msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				fds, _ := unix.ParseUnixRights(&m)
				for _, fd := range fds {
					unix.Close(fd)
					line += " +fd"
				}
			}
		}
		if c.Execute != "qmp_capabilities" {
			s.mu.Lock()
			s.cmds = append(s.cmds, line)
			s.mu.Unlock()
		}
		if class, ok := s.fail[c.Execute]; ok {
			s.send(map[string]any{"error": map[string]string{"class": class, "desc": c.Execute + " failed"}, "id": c.ID})
			continue
		}
		switch c.Execute {
		case "add-fd":
			s.send(map[string]any{"return": map[string]int{"fdset-id": 7, "fd": 42}, "id": c.ID})
		case "device_del":
			var a struct{ ID string }
			json.Unmarshal(c.Arguments, &a)
			s.send(map[string]any{"return": map[string]any{}, "id": c.ID})
			s.send(map[string]any{"event": "DEVICE_DELETED", "data": map[string]string{"device": a.ID, "path": "/machine/peripheral/" + a.ID},
				"timestamp": map[string]int64{"seconds": 1, "microseconds": 0}})
		default:
			s.send(map[string]any{"return": map[string]any{}, "id": c.ID})
		}
	}
}

func (s *fakeQMP) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cmds
	s.cmds = nil
	return c
}

// fakeVM is a QEMU whose QMP client talks to a fakeQMP.
func fakeVM(t *testing.T, machine string, fail map[string]string) (*QEMU, *fakeQMP) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	srv := &fakeQMP{t: t, fail: fail}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := l.AcceptUnix()
		l.Close()
		if err != nil {
			return
		}
		defer conn.Close()
		srv.conn = conn
		srv.serve()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := qmp.Dial(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); wg.Wait() })
	q := &QEMU{cfg: vm.Config{MachineType: machine}, log: slog.New(slog.DiscardHandler), done: make(chan struct{}), client: c}
	return q, srv
}

func diskFile(t *testing.T, size int) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	return f
}

func ctx5(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantSeq(t *testing.T, got []string, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("commands:\n %s\nwant %d commands starting:\n %s", strings.Join(got, "\n "), len(want), strings.Join(want, "\n "))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("command %d: %s\nwant prefix %s", i, got[i], want[i])
		}
	}
}

func TestAddRemoveDiskVirtioBlk(t *testing.T) {
	q, srv := fakeVM(t, MachineQ35, nil)
	f := diskFile(t, 1<<20)
	d, err := q.AddDisk(ctx5(t), vm.DiskConfig{ID: "hd-c1-0", File: f, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Serial != "hd-c1-0" || d.Driver != vm.DiskVirtioBlk {
		t.Errorf("disk %+v", d)
	}
	wantSeq(t, srv.take(),
		`add-fd {"opaque":"hull:hd-c1-0"} +fd`,
		`blockdev-add {"aio":"threads","cache":{"direct":false,"no-flush":false},"driver":"file","filename":"/dev/fdset/7","locking":"off","node-name":"drv-hd-c1-0","read-only":true}`,
		`device_add {"bus":"rp0","drive":"drv-hd-c1-0","driver":"virtio-blk-pci","id":"hd-c1-0","serial":"hd-c1-0"}`,
	)
	// A second disk takes the next root port.
	if _, err := q.AddDisk(ctx5(t), vm.DiskConfig{ID: "hd-c1-1", File: f}); err != nil {
		t.Fatal(err)
	}
	if got := srv.take(); len(got) != 3 || !strings.Contains(got[2], `"bus":"rp1"`) {
		t.Errorf("second disk: %q", got)
	}
	if err := q.RemoveDisk(ctx5(t), "hd-c1-0"); err != nil {
		t.Fatal(err)
	}
	wantSeq(t, srv.take(),
		`device_del {"id":"hd-c1-0"}`,
		`blockdev-del {"node-name":"drv-hd-c1-0"}`,
		`remove-fd {"fdset-id":7}`,
	)
	// Unknown or removed disks: nothing to do.
	if err := q.RemoveDisk(ctx5(t), "hd-c1-0"); err != nil {
		t.Fatal(err)
	}
	if got := srv.take(); len(got) != 0 {
		t.Errorf("second remove sent %q", got)
	}
	// The freed port is reused.
	if _, err := q.AddDisk(ctx5(t), vm.DiskConfig{ID: "hd-c2-0", File: f}); err != nil {
		t.Fatal(err)
	}
	if got := srv.take(); len(got) != 3 || !strings.Contains(got[2], `"bus":"rp0"`) {
		t.Errorf("third disk: %q", got)
	}
}

func TestAddDiskSCSI(t *testing.T) {
	q, srv := fakeVM(t, MachineQ35, nil)
	f := diskFile(t, 4096)
	for i, id := range []string{"a", "b"} {
		if _, err := q.AddDisk(ctx5(t), vm.DiskConfig{ID: id, File: f, Driver: vm.DiskVirtioSCSI}); err != nil {
			t.Fatal(err)
		}
		got := srv.take()
		if i == 0 {
			wantSeq(t, got,
				`device_add {"bus":"rp0","driver":"virtio-scsi-pci","id":"scsi0"}`,
				`add-fd`, `blockdev-add`,
				`device_add {"bus":"scsi0.0","channel":0,"drive":"drv-a","driver":"scsi-hd","id":"a","lun":0,"scsi-id":0,"serial":"a"}`)
		} else {
			wantSeq(t, got, `add-fd`, `blockdev-add`,
				`device_add {"bus":"scsi0.0","channel":0,"drive":"drv-b","driver":"scsi-hd","id":"b","lun":0,"scsi-id":1,"serial":"b"}`)
		}
	}
}

func TestAddDiskRollsBack(t *testing.T) {
	q, srv := fakeVM(t, MachineQ35, map[string]string{"device_add": "GenericError", "device_del": "DeviceNotFound"})
	f := diskFile(t, 4096)
	_, err := q.AddDisk(ctx5(t), vm.DiskConfig{ID: "x", File: f})
	if err == nil || !strings.Contains(err.Error(), "hotplugging disk x") || !strings.Contains(err.Error(), "device_add failed") {
		t.Fatalf("error %v", err)
	}
	wantSeq(t, srv.take(), `add-fd`, `blockdev-add`, `device_add`,
		`device_del {"id":"x"}`, `blockdev-del {"node-name":"drv-x"}`, `remove-fd {"fdset-id":7}`)
	if len(q.Disks()) != 0 {
		t.Errorf("disks %v after a failed add", q.Disks())
	}
}

func TestAddDiskRefusesEmptyAndBadIDs(t *testing.T) {
	q, srv := fakeVM(t, MachineQ35, nil)
	if _, err := q.AddDisk(ctx5(t), vm.DiskConfig{ID: "e", File: diskFile(t, 0)}); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty file: %v", err)
	}
	for _, id := range []string{"", "a,b", strings.Repeat("x", 21)} {
		if _, err := q.AddDisk(ctx5(t), vm.DiskConfig{ID: id, File: diskFile(t, 10)}); err == nil {
			t.Errorf("id %q accepted", id)
		}
	}
	if got := srv.take(); len(got) != 0 {
		t.Errorf("refused disks sent %q", got)
	}
	mq, _ := fakeVM(t, MachineMicrovm, nil)
	if _, err := mq.AddDisk(ctx5(t), vm.DiskConfig{ID: "m", File: diskFile(t, 10)}); err == nil || !strings.Contains(err.Error(), "microvm") {
		t.Errorf("microvm: %v", err)
	}
}

func TestAddDiskPortsExhausted(t *testing.T) {
	q, _ := fakeVM(t, MachineQ35, nil)
	f := diskFile(t, 10)
	for i := range HotplugPorts {
		if _, err := q.AddDisk(ctx5(t), vm.DiskConfig{ID: "d" + string(rune('a'+i)), File: f}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.AddDisk(ctx5(t), vm.DiskConfig{ID: "z", File: f}); err == nil || !strings.Contains(err.Error(), "hotplug ports are in use") {
		t.Errorf("ninth disk: %v", err)
	}
}
