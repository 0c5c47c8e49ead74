// Command containerd-shim-hull-v2 is Hull's containerd shim: every pod in
// its own VM. See internal/shim and docs/shim.md.
package main

import (
	"github.com/hull-runtime/hull/internal/shim"
)

func main() {
	shim.Run()
}
