// Package stacks reads every goroutine's stack of this process, whole:
// for the shim's SIGUSR1 dump and the tests' goroutine leak check.
package stacks

import "runtime"

// All is runtime.Stack of every goroutine, in a buffer grown until the
// dump fits.
func All() []byte {
	buf := make([]byte, 64<<10)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}
