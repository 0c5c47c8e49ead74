package guestimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// runFunc runs a command in dir and returns its standard output; it is a
// variable on fetcher so tests can stand in for apt.
type runFunc func(ctx context.Context, dir, name string, args ...string) ([]byte, error)

func runCommand(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = msg[len(msg)-2000:]
		}
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return out, nil
}

// fetcher finds Debian's kernel package with apt and downloads it.
type fetcher struct {
	run runFunc
	log io.Writer
}

var realImage = regexp.MustCompile(`^linux-image-[0-9][^ ]*$`)

// resolve maps a metapackage such as linux-image-amd64 to the real kernel
// package it depends on (linux-image-6.1.0-57-amd64). A name that already
// is a versioned kernel package is returned as it is.
func (f *fetcher) resolve(ctx context.Context, pkg string) (string, error) {
	if realImage.MatchString(pkg) {
		return pkg, nil
	}
	for attempt := 0; ; attempt++ {
		out, err := f.run(ctx, "", "apt-cache", "depends", pkg)
		if err == nil {
			if real := parseDepends(out); real != "" {
				return real, nil
			}
		}
		if attempt > 0 {
			if err != nil {
				return "", fmt.Errorf("resolving kernel package %s: %w", pkg, err)
			}
			return "", fmt.Errorf("resolving kernel package %s: apt-cache depends lists no linux-image-<version> package", pkg)
		}
		fmt.Fprintf(f.log, "kernel package %s not known to apt; running apt-get update\n", pkg)
		if _, err := f.run(ctx, "", "apt-get", "update"); err != nil {
			return "", fmt.Errorf("resolving kernel package %s: %w", pkg, err)
		}
	}
}

// parseDepends returns the first real linux-image-<version> dependency in
// `apt-cache depends` output.
func parseDepends(out []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimLeft(sc.Text(), " |")
		dep, ok := strings.CutPrefix(line, "Depends: ")
		if ok && realImage.MatchString(dep) {
			return dep
		}
	}
	return ""
}

// fetch returns the path of pkg's .deb in workDir, downloading it with
// `apt-get download` unless the file apt would fetch is already there.
func (f *fetcher) fetch(ctx context.Context, pkg, workDir string) (string, error) {
	out, err := f.run(ctx, "", "apt-cache", "show", "--no-all-versions", pkg)
	if err != nil {
		return "", fmt.Errorf("looking up kernel package %s: %w", pkg, err)
	}
	name := debFileName(out)
	if name == "" {
		return "", fmt.Errorf("looking up kernel package %s: apt-cache show gives no Filename", pkg)
	}
	dest := filepath.Join(workDir, name)
	if fi, err := os.Stat(dest); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
		fmt.Fprintf(f.log, "using cached %s\n", dest)
		return dest, nil
	}
	// Download into a private directory and rename, so an interrupted
	// download is never taken for a cached package.
	tmp, err := os.MkdirTemp(workDir, ".download-")
	if err != nil {
		return "", fmt.Errorf("downloading kernel package %s: %w", pkg, err)
	}
	defer os.RemoveAll(tmp)
	fmt.Fprintf(f.log, "downloading %s with apt-get download\n", pkg)
	if _, err := f.run(ctx, tmp, "apt-get", "download", pkg); err != nil {
		return "", fmt.Errorf("downloading kernel package %s: %w", pkg, err)
	}
	got, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(got) != 1 {
		return "", fmt.Errorf("downloading kernel package %s: apt-get download left %d .deb files", pkg, len(got))
	}
	if err := os.Rename(got[0], dest); err != nil {
		return "", fmt.Errorf("downloading kernel package %s: %w", pkg, err)
	}
	return dest, nil
}

func debFileName(show []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(show))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Filename: "); ok {
			return path.Base(strings.TrimSpace(v))
		}
	}
	return ""
}

// tarSource opens the filesystem tree of a kernel package as a tar stream.
type tarSource func(ctx context.Context) (io.ReadCloser, error)

// debTar streams `dpkg-deb --fsys-tarfile deb`.
func debTar(deb string) tarSource {
	return func(ctx context.Context) (io.ReadCloser, error) {
		if _, err := os.Stat(deb); err != nil {
			return nil, fmt.Errorf("kernel package: %w", err)
		}
		ctx, cancel := context.WithCancel(ctx)
		cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
		cmd.WaitDelay = 5 * time.Second
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			cancel()
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			cancel()
			return nil, fmt.Errorf("running dpkg-deb on %s: %w", deb, err)
		}
		return &cmdReader{ReadCloser: out, cmd: cmd, cancel: cancel, stderr: &stderr, deb: deb}, nil
	}
}

type cmdReader struct {
	io.ReadCloser
	cmd    *exec.Cmd
	cancel context.CancelFunc
	stderr *bytes.Buffer
	deb    string
	eof    bool
}

func (r *cmdReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		r.eof = true
	}
	return n, err
}

// Close stops dpkg-deb if the stream was not read to its end (an early stop
// is not an error) and reports its failure otherwise.
func (r *cmdReader) Close() error {
	if !r.eof {
		// Closing our end first makes dpkg-deb's decompressor child die of
		// SIGPIPE; killing dpkg-deb alone would leave it holding stderr.
		r.ReadCloser.Close()
		r.cancel()
	}
	err := r.cmd.Wait()
	r.cancel()
	if r.eof && err != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", r.deb, err, strings.TrimSpace(r.stderr.String()))
	}
	return nil
}

// errStop ends a walk early without error.
var errStop = errors.New("stop walking")

// walkTar calls visit for every regular file of the tree with its cleaned
// path (no leading "./" or "/"). visit may return errStop.
func walkTar(ctx context.Context, src tarSource, visit func(name string, h *tar.Header, r io.Reader) error) (err error) {
	rc, err := src(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := rc.Close(); err == nil {
			err = cerr
		}
	}()
	tr := tar.NewReader(rc)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading kernel package tree: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if err := visit(name, h, tr); err != nil {
			if errors.Is(err, errStop) {
				return nil
			}
			return err
		}
	}
}
