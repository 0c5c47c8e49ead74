package guestimage

import (
	"fmt"
	"os"
	"path/filepath"
)

// outFile is an output written to a temporary name, renamed into place by
// commit; discard removes it if it was never committed.
type outFile struct {
	tmp, dest string
	done      bool
}

func writeTemp(dir, name string, data []byte) (outFile, error) {
	f, err := os.CreateTemp(dir, "."+name+".tmp-")
	if err != nil {
		return outFile{}, fmt.Errorf("writing %s: %w", name, err)
	}
	o := outFile{tmp: f.Name(), dest: filepath.Join(dir, name)}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(o.tmp)
		return outFile{}, fmt.Errorf("writing %s: %w", o.dest, err)
	}
	return o, nil
}

func (o *outFile) commit() error {
	if err := os.Rename(o.tmp, o.dest); err != nil {
		return fmt.Errorf("installing %s: %w", o.dest, err)
	}
	o.done = true
	return nil
}

func (o *outFile) discard() {
	if !o.done {
		os.Remove(o.tmp)
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}
