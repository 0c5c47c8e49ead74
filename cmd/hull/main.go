// Command hull is Hull's operator CLI: `hull run`, `hull guest build`.
package main

import (
	"os"

	"github.com/hull-runtime/hull/internal/cli"
	"github.com/hull-runtime/hull/internal/fsguard"
)

func main() {
	fsguard.Main() // QEMU starts through here (internal/fsguard)
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
