//go:build !hull_failpoints

package failpoint

// Enabled says whether this binary honours the failpoint annotation: not
// without -tags hull_failpoints.
const Enabled = false
