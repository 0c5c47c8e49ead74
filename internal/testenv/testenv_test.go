package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Under HULL_E2E=1 a missing prerequisite fails the test; without it the
// test skips. Checked in a child test process, whose outcome is read.
func TestRequireFailsUnderE2E(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") == "1" {
		Require(t, "", "needs a unicorn")
		t.Log("ran past Require")
		return
	}
	for _, tc := range []struct {
		e2e, want string
	}{
		{"1", "--- FAIL"},
		{"", "--- SKIP"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRequireFailsUnderE2E$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", "HULL_E2E="+tc.e2e)
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "needs a unicorn") || strings.Contains(string(out), "ran past Require") {
			t.Errorf("HULL_E2E=%q: want %s naming the reason:\n%s", tc.e2e, tc.want, out)
		}
	}
}

func TestReasons(t *testing.T) {
	if Bins("sh") != "" || Bins("no-such-command-hull") == "" {
		t.Error("Bins")
	}
	if Files("/") != "" || Files("/no/such/file") == "" {
		t.Error("Files")
	}
	t.Setenv("TESTENV_X", "v")
	vals, why := Env("TESTENV_X", "TESTENV_UNSET_Y")
	if vals[0] != "v" || !strings.Contains(why, "TESTENV_UNSET_Y") {
		t.Errorf("Env = %v %q", vals, why)
	}
}
