// Package releasers is the one place that says how every kind of
// resource Hull records is released (docs/lifecycle.md): the state
// package's own kinds and those of the packages that own the others.
// The shim's release path and `hull gc` both take their releasers from
// All, so a kind added without its releaser fails a test here rather than
// surfacing at teardown as "no releaser for kind".
package releasers

import (
	"fmt"

	"github.com/hull-runtime/hull/internal/device"
	"github.com/hull-runtime/hull/internal/network"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/vm/qemu"
)

// All returns the releaser of every kind Hull records.
func All() state.Releasers {
	all := state.BuiltinReleasers()
	for _, owned := range []state.Releasers{network.Releasers(), device.Releasers(), qemu.Releasers()} {
		for kind, fn := range owned {
			if _, ok := all[kind]; ok {
				panic(fmt.Sprintf("releasers: two releasers for kind %q", kind))
			}
			all[kind] = fn
		}
	}
	return all
}
