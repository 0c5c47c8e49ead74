//go:build hull_failpoints

package failpoint

// Enabled says whether this binary honours the failpoint annotation: it
// was built with -tags hull_failpoints.
const Enabled = true
