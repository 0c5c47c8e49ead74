package testenv

import (
	"fmt"
	"os"
	"syscall"
	"testing"
)

func TestOutcomes(t *testing.T) {
	_, err := os.Open("/nonexistent-hull-test")
	text := fmt.Sprintf("a %s\nb %s\nc %s\n", Outcome(nil), Outcome(err), Outcome(fmt.Errorf("wrapped: %w", syscall.EPERM)))
	got := ParseOutcomes(text)
	want := map[string]string{"a": "ok", "b": "no such file or directory", "c": "operation not permitted"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q (from %q)", k, got[k], v, text)
		}
	}
	if o := Outcome(fmt.Errorf("plain")); o != "plain" {
		t.Errorf("an error without errno: %q", o)
	}
}
