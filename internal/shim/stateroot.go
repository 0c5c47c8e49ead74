package shim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/hull-runtime/hull/internal/config"
)

// stateRootFile, in a task's bundle, names the directory holding the
// sandbox's state (runtime.state_dir of the pod's configuration).
// `shim delete` runs in the bundle without the runtime options that
// name the configuration, so Create leaves it this note; the bundle is
// containerd's and outlives the shim until that delete. A bundle without
// it (a Create that never got that far) means the default.
const stateRootFile = "hull-state-root"

func writeStateRoot(bundle, root string) error {
	p := filepath.Join(bundle, stateRootFile)
	if err := os.WriteFile(p, []byte(root+"\n"), 0o600); err != nil {
		return fmt.Errorf("writing the state root to the bundle: %w", err)
	}
	return nil
}

func readStateRoot(bundle string) (string, error) {
	b, err := os.ReadFile(filepath.Join(bundle, stateRootFile))
	if errors.Is(err, fs.ErrNotExist) {
		return config.DefaultRunDir, nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the state root from the bundle: %w", err)
	}
	root := strings.TrimSpace(string(b))
	if !filepath.IsAbs(root) {
		return "", fmt.Errorf("bundle file %s names %q, not an absolute path", filepath.Join(bundle, stateRootFile), root)
	}
	return filepath.Clean(root), nil
}
