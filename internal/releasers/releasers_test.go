package releasers

import (
	"testing"

	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/vm/qemu"
)

// Every kind a record can hold has its releaser, and nothing else does.
func TestAllReleasesEveryKind(t *testing.T) {
	kinds := []state.Kind{
		state.KindProcess, state.KindMount, state.KindDir, state.KindFile, state.KindSocket,
		state.KindTap, state.KindTCFilter, state.KindMacvtap, state.KindFD, state.KindCgroup,
		state.KindLoopDev, qemu.KindProcFDMount,
	}
	all := All()
	for _, k := range kinds {
		if all[k] == nil {
			t.Errorf("no releaser for kind %q", k)
		}
	}
	if len(all) != len(kinds) {
		t.Errorf("%d releasers for %d kinds: %v", len(all), len(kinds), all)
	}
}
