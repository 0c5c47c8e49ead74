// Command nnp is the entrypoint of critest's nonewprivs image, installed
// setuid root: it prints the effective uid it runs with, which is 0 unless
// no_new_privs kept the exec from raising it.
package main

import (
	"fmt"
	"os"
)

func main() { fmt.Printf("Effective uid: %d\n", os.Geteuid()) }
