package testenv

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

// A test's child (an attack standing for a hostile guest, say) reports
// each attempt as a line "name outcome"; the test reads the lines back
// and compares them with what it wants.

// Outcome is how one attempt ended: "ok", the errno's text ("permission
// denied"), or the error's.
func Outcome(err error) string {
	if err == nil {
		return "ok"
	}
	if errno := syscall.Errno(0); errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}

// ParseOutcomes reads "name outcome" lines.
func ParseOutcomes(text string) map[string]string {
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			got[k] = v
		}
	}
	return got
}

// CheckOutcomes fails t for each attempt of want whose outcome in got
// differs.
func CheckOutcomes(t testing.TB, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
}
