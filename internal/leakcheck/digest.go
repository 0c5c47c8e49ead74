package leakcheck

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// TreeDigest hashes every name, mode and regular file's content under
// roots (files or directories), without following symlinks: a canary a
// test plants outside what it attacks is unchanged when its digest is.
// A tree that cannot be read digests to "error: ...".
func TreeDigest(roots ...string) string {
	h := sha256.New()
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%s %v\n", p, info.Mode())
			if info.Mode().IsRegular() {
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				h.Write(b)
			}
			return nil
		})
		if err != nil {
			return "error: " + err.Error()
		}
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}
