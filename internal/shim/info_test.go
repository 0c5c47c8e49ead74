package shim

import (
	"slices"
	"testing"

	"github.com/hull-runtime/hull/internal/guest/nsinit"
)

// The mount options the shim advertises are exactly those the guest's
// helper handles (the shim keeps its own copy: it links no guest code).
func TestAdvertisedMountOptionsAreTheGuests(t *testing.T) {
	if got, want := ociFeatures().MountOptions, nsinit.MountOptionNames(); !slices.Equal(got, want) {
		t.Errorf("advertised %v\nguest has  %v", got, want)
	}
	if !slices.Contains(guestMountOptions, "rro") {
		t.Error("rro not advertised")
	}
}
