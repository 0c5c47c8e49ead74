package cli

import (
	"flag"
	"fmt"

	"github.com/hull-runtime/hull/internal/config"
)

// stateRootFlags are `--root` and `--config` of the commands that read the
// sandboxes' state (ps, gc, collect): the root is --root when given, else
// runtime.state_dir of the configuration the shims use.
type stateRootFlags struct {
	root, config string
}

func (f *stateRootFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.root, "root", "", "directory holding the sandboxes' state (default: runtime.state_dir of the configuration, "+config.DefaultRunDir+")")
	fs.StringVar(&f.config, "config", "", "configuration file (default: $HULL_CONFIG, else "+config.DefaultPath+")")
}

func (f *stateRootFlags) resolve() (string, error) {
	if f.root != "" {
		return f.root, nil
	}
	cfg, _, _, err := config.Load(f.config)
	if err != nil {
		return "", fmt.Errorf("finding the state directory: %w", err)
	}
	return cfg.Runtime.StateDir, nil
}
