// Command hull is Hull's operator CLI: `hull run`, `hull guest build`.
package main

import (
	"os"

	"github.com/hull-runtime/hull/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
