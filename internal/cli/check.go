package cli

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/hostcheck"
)

// checkCmd prints each requirement, pass or fail, with the fix for each
// failure. It exits 1 when the configuration is invalid or a required
// check fails; optional ones (KVM, vsock) are warnings.
func checkCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hull check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "configuration file (default: $HULL_CONFIG, else "+config.DefaultPath+")")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "hull check: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	cfg, src, _, ok := loadConfig("hull check", *cfgPath, stderr)
	if !ok {
		fmt.Fprintf(stdout, "FAIL config: %s is invalid (see above)\n", src)
		return 1
	}
	fmt.Fprintf(stdout, "PASS config: %s\n", src)

	rep := hostcheck.Check(context.Background(), cfg)
	warnings := 0
	for _, r := range rep.Results {
		fmt.Fprintf(stdout, "%s %s: %s\n", status(r), r.Name, r.Detail)
		if !r.OK && r.Fix != "" {
			fmt.Fprintf(stdout, "     fix: %s\n", r.Fix)
		}
		if !r.OK && !r.Required {
			warnings++
		}
	}
	if failed := rep.Failed(); len(failed) > 0 {
		fmt.Fprintf(stdout, "\n%d required check(s) failed: this host cannot run Hull yet\n", len(failed))
		return 1
	}
	fmt.Fprintf(stdout, "\nthis host can run Hull (%d warning(s))\n", warnings)
	return 0
}
