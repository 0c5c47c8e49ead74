package initsys

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseModules(t *testing.T) {
	in := `# virtio first
/lib/modules/6.1.0-57-amd64/kernel/drivers/virtio/virtio.ko

   /lib/modules/6.1.0-57-amd64/kernel/drivers/char/virtio_console.ko  
# end
`
	got, err := ParseModules(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"/lib/modules/6.1.0-57-amd64/kernel/drivers/virtio/virtio.ko",
		"/lib/modules/6.1.0-57-amd64/kernel/drivers/char/virtio_console.ko",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q", got)
	}
	if _, err := ParseModules(strings.NewReader("virtio.ko\n")); err == nil {
		t.Fatal("relative module path accepted")
	}
}

func TestLoadModulesContinuesAfterFailure(t *testing.T) {
	list := filepath.Join(t.TempDir(), "modules")
	os.WriteFile(list, []byte("/a.ko\n/b.ko\n/c.ko\n"), 0o644)
	var tried []string
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := LoadModules(log, list, func(p string) error {
		tried = append(tried, p)
		if p == "/b.ko" {
			return errors.New("bad module")
		}
		return nil
	})
	if err != nil || n != 2 {
		t.Fatalf("loaded %d, %v", n, err)
	}
	if !reflect.DeepEqual(tried, []string{"/a.ko", "/b.ko", "/c.ko"}) {
		t.Fatalf("order %q", tried)
	}
	n, err = LoadModules(log, filepath.Join(t.TempDir(), "missing"), nil)
	if n != 0 || err != nil {
		t.Fatalf("missing list: %d, %v", n, err)
	}
}

func TestCmdline(t *testing.T) {
	m := Cmdline("console=ttyS0 panic=1 quiet hull.channel=vsock\n")
	if m["hull.channel"] != "vsock" || m["panic"] != "1" {
		t.Fatalf("got %v", m)
	}
	if _, ok := m["quiet"]; !ok {
		t.Fatal("bare key missing")
	}
}
