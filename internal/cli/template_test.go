package cli

import (
	"strings"
	"testing"
)

// TestTemplateCommandRefusals: the template commands name what is wrong.
func TestTemplateCommandRefusals(t *testing.T) {
	root := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"template"}, 2, "usage: hull template ls"},
		{[]string{"template", "mv"}, 2, `unknown subcommand "mv"`},
		{[]string{"template", "rm", "--root", root}, 2, "name templates by key"},
		{[]string{"template", "rm", "--root", root, "--all", "abc"}, 2, "name templates by key"},
		{[]string{"template", "rm", "--root", root, "abc"}, 1, `template "abc": no such template`},
		{[]string{"template", "ls", "--root", root, "extra"}, 2, `unexpected argument "extra"`},
	} {
		code, _, errOut := runHull(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("hull %s: exit %d, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), code, errOut, tc.code, tc.want)
		}
	}
	code, out, errOut := runHull(t, "template", "ls", "--root", root)
	if code != 0 || !strings.HasPrefix(out, "TEMPLATE") || errOut != "" {
		t.Errorf("hull template ls on an empty root: exit %d, %q, %q", code, out, errOut)
	}
	code, out, _ = runHull(t, "template", "ls", "--root", root, "--json")
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("hull template ls --json on an empty root: exit %d, %q; want []", code, out)
	}
}
