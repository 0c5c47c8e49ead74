// Package harness drives a private containerd through CRI for Hull's
// end-to-end tests and benchmarks: it builds test images from the host's
// static busybox, starts containerd with its own root, state, sockets and
// network namespace, talks CRI to it, and finds what a pod left behind.
package harness

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
	"time"
)

// Image references the harness builds and imports.
const (
	// BusyboxImage runs busybox's sh by default.
	BusyboxImage = "docker.io/library/busybox:latest"
	// PauseImage is containerd's sandbox_image: busybox sleeping forever.
	PauseImage = "hull.test/pause:e2e"
	// NoEntrypointImage names an entrypoint that is not in its rootfs.
	NoEntrypointImage = "hull.test/no-entrypoint:e2e"
	// MissingEntrypoint is NoEntrypointImage's entrypoint.
	MissingEntrypoint = "/bin/no-such-entrypoint"
)

// Image is one image of a test archive; every image shares one layer made
// from the host's static busybox.
type Image struct {
	Ref        string
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	// User is the image's default user ("" for root).
	User string
	// Files, if any, are a second layer of this image only.
	Files []File
}

// File is a regular file of an image's own layer, owned by root.
type File struct {
	Path string // relative, e.g. "usr/local/bin/nnp"
	Mode int64  // permission bits, setuid included
	Body []byte
}

// TestImages are the images every harness containerd gets.
func TestImages() []Image {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	return []Image{
		{Ref: BusyboxImage, Cmd: []string{"sh"}, Env: env, WorkingDir: "/"},
		{Ref: PauseImage, Entrypoint: []string{"/bin/sleep", "2147483647"}, Env: env, WorkingDir: "/"},
		{Ref: NoEntrypointImage, Entrypoint: []string{MissingEntrypoint}, Env: env, WorkingDir: "/"},
	}
}

// epoch is every file's and image's timestamp, so archives are reproducible.
var epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// WriteImages writes an OCI image layout archive (as `ctr images import`
// reads it) holding imgs, all on one layer with busybox (a static binary)
// as /bin/busybox and its applets as symlinks. The same inputs give the
// same bytes.
func WriteImages(w io.Writer, busybox string, imgs []Image) error {
	layerTar, err := busyboxLayer(busybox)
	if err != nil {
		return err
	}
	diffID := digest(layerTar)
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	zw.Write(layerTar)
	if err := zw.Close(); err != nil {
		return fmt.Errorf("compressing the layer: %w", err)
	}
	blobs := map[string][]byte{}
	add := func(b []byte) descriptor {
		d := digest(b)
		blobs[d] = b
		return descriptor{Digest: d, Size: int64(len(b))}
	}
	layer := add(gz.Bytes())
	layer.MediaType = mediaLayer

	var manifests []descriptor
	for _, img := range imgs {
		layers, diffIDs := []descriptor{layer}, []string{diffID}
		if len(img.Files) > 0 {
			own, err := filesLayer(img.Files)
			if err != nil {
				return fmt.Errorf("layer of image %s: %w", img.Ref, err)
			}
			diffIDs = append(diffIDs, digest(own))
			var gz bytes.Buffer
			zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
			zw.Write(own)
			if err := zw.Close(); err != nil {
				return fmt.Errorf("compressing the layer of image %s: %w", img.Ref, err)
			}
			d := add(gz.Bytes())
			d.MediaType = mediaLayer
			layers = append(layers, d)
		}
		cfg, err := json.Marshal(map[string]any{
			"created":      epoch,
			"architecture": "amd64",
			"os":           "linux",
			"config": map[string]any{
				"Entrypoint": img.Entrypoint,
				"Cmd":        img.Cmd,
				"Env":        img.Env,
				"WorkingDir": img.WorkingDir,
				"User":       img.User,
			},
			"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
		})
		if err != nil {
			return err
		}
		c := add(cfg)
		c.MediaType = mediaConfig
		man, err := json.Marshal(map[string]any{
			"schemaVersion": 2,
			"mediaType":     mediaManifest,
			"config":        c,
			"layers":        layers,
		})
		if err != nil {
			return err
		}
		m := add(man)
		m.MediaType = mediaManifest
		m.Platform = &platform{Architecture: "amd64", OS: "linux"}
		m.Annotations = map[string]string{
			"io.containerd.image.name":          img.Ref,
			"org.opencontainers.image.ref.name": img.Ref,
		}
		manifests = append(manifests, m)
	}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": manifests})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	file := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)),
			ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	if err := file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := file("index.json", index); err != nil {
		return err
	}
	names := make([]string, 0, len(blobs))
	for d := range blobs {
		names = append(names, d)
	}
	sort.Strings(names)
	for _, d := range names {
		if err := file("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), blobs[d]); err != nil {
			return err
		}
	}
	return tw.Close()
}

// WriteImagesFile writes the archive of WriteImages to a file.
func WriteImagesFile(file, busybox string, imgs []Image) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := WriteImages(f, busybox, imgs); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", file, err)
	}
	return f.Close()
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// busyboxLayer is the uncompressed layer: directories, /bin/busybox, one
// symlink per applet (`busybox --list-full`), /etc/passwd and /etc/group.
func busyboxLayer(busybox string) ([]byte, error) {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return nil, fmt.Errorf("reading busybox: %w", err)
	}
	out, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("listing busybox applets (%s --list-full): %w", busybox, err)
	}
	type entry struct {
		hdr  tar.Header
		body []byte
	}
	entries := map[string]entry{}
	dir := func(name string, mode int64) {
		entries[name+"/"] = entry{hdr: tar.Header{Name: name + "/", Mode: mode, Typeflag: tar.TypeDir}}
	}
	for _, d := range []string{"bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "root", "proc", "sys", "dev", "run", "var"} {
		dir(d, 0o755)
	}
	dir("tmp", 0o1777)
	entries["bin/busybox"] = entry{hdr: tar.Header{Name: "bin/busybox", Mode: 0o755, Typeflag: tar.TypeReg, Size: int64(len(bin))}, body: bin}
	for _, l := range strings.Fields(string(out)) {
		if l == "bin/busybox" || strings.Contains(l, "..") {
			continue
		}
		dir(path.Dir(l), 0o755)
		entries[l] = entry{hdr: tar.Header{Name: l, Mode: 0o777, Typeflag: tar.TypeSymlink, Linkname: "/bin/busybox"}}
	}
	text := func(name, s string) {
		entries[name] = entry{hdr: tar.Header{Name: name, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(s))}, body: []byte(s)}
	}
	text("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
	text("etc/group", "root:x:0:\nnogroup:x:65534:\n")

	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		e.hdr.ModTime = epoch
		e.hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(&e.hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// filesLayer is the uncompressed layer of files, with their parent
// directories.
func filesLayer(files []File) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		var parents []string
		for d := path.Dir(f.Path); d != "." && d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: f.Path, Mode: f.Mode, Typeflag: tar.TypeReg, Size: int64(len(f.Body)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
