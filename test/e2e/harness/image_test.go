package harness

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
)

func TestWriteImagesIsReproducibleAndComplete(t *testing.T) {
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("needs a static /bin/busybox (apt-get install busybox-static)")
	}
	var a, b bytes.Buffer
	if err := WriteImages(&a, "/bin/busybox", TestImages()); err != nil {
		t.Fatal(err)
	}
	if err := WriteImages(&b, "/bin/busybox", TestImages()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two builds of the same images differ")
	}

	files := map[string][]byte{}
	tr := tar.NewReader(&a)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name], _ = io.ReadAll(tr)
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	blob := func(d string) []byte {
		t.Helper()
		b, ok := files["blobs/sha256/"+strings.TrimPrefix(d, "sha256:")]
		if !ok {
			t.Fatalf("blob %s missing", d)
		}
		if digest(b) != d {
			t.Fatalf("blob %s has digest %s", d, digest(b))
		}
		return b
	}
	refs := map[string]bool{}
	for _, m := range index.Manifests {
		refs[m.Annotations["org.opencontainers.image.ref.name"]] = true
		var man struct {
			Config descriptor   `json:"config"`
			Layers []descriptor `json:"layers"`
		}
		if err := json.Unmarshal(blob(m.Digest), &man); err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			Config struct{ Entrypoint, Cmd []string } `json:"config"`
			RootFS struct {
				DiffIDs []string `json:"diff_ids"`
			} `json:"rootfs"`
		}
		if err := json.Unmarshal(blob(man.Config.Digest), &cfg); err != nil {
			t.Fatal(err)
		}
		if len(man.Layers) != 1 || len(cfg.RootFS.DiffIDs) != 1 {
			t.Fatalf("want one layer: %+v", man)
		}
		zr, err := gzip.NewReader(bytes.NewReader(blob(man.Layers[0].Digest)))
		if err != nil {
			t.Fatal(err)
		}
		layer, _ := io.ReadAll(zr)
		if digest(layer) != cfg.RootFS.DiffIDs[0] {
			t.Errorf("diff_id %s does not match the layer (%s)", cfg.RootFS.DiffIDs[0], digest(layer))
		}
		names := map[string]string{}
		lr := tar.NewReader(bytes.NewReader(layer))
		for {
			h, err := lr.Next()
			if err != nil {
				break
			}
			names[h.Name] = h.Linkname
		}
		for _, want := range []string{"bin/busybox", "bin/sh", "bin/cat", "etc/passwd", "etc/group", "tmp/"} {
			if _, ok := names[want]; !ok {
				t.Errorf("layer lacks %s", want)
			}
		}
		if names["bin/sh"] != "/bin/busybox" {
			t.Errorf("bin/sh links to %q", names["bin/sh"])
		}
	}
	for _, img := range TestImages() {
		if !refs[img.Ref] {
			t.Errorf("index.json lacks %s", img.Ref)
		}
	}
}

func TestExitCodeOf(t *testing.T) {
	for s, want := range map[string]int{
		`{"metadata":{},"status":"Success"}`: 0,
		`{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: exit status 5","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"5"}]}}`: 5,
	} {
		if got, err := exitCodeOf(s); err != nil || got != want {
			t.Errorf("exitCodeOf(%s) = %d, %v; want %d", s, got, err, want)
		}
	}
	if _, err := exitCodeOf(""); err == nil {
		t.Error("an empty status is not an exit")
	}
}

func TestReadLog(t *testing.T) {
	f := t.TempDir() + "/c.log"
	os.WriteFile(f, []byte("2024-01-01T00:00:00.000000001Z stdout P hel\n"+
		"2024-01-01T00:00:00.000000002Z stderr F oops\n"+
		"2024-01-01T00:00:00.000000003Z stdout F lo\n"+
		"2024-01-01T00:00:00.000000004Z stdout F \n"), 0o644)
	out, err := LogText(f, "stdout")
	if err != nil || out != "hello\n\n" {
		t.Errorf("stdout = %q, %v", out, err)
	}
	if out, _ := LogText(f, "stderr"); out != "oops\n" {
		t.Errorf("stderr = %q", out)
	}
}
