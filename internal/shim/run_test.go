package shim

import (
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	// containerd 1.6's start, and its delete.
	f, err := parseFlags(strings.Fields("-namespace k8s.io -address /run/containerd/containerd.sock -publish-binary /usr/bin/containerd -id abc -debug start"))
	if err != nil {
		t.Fatal(err)
	}
	if f.namespace != "k8s.io" || f.id != "abc" || f.address != "/run/containerd/containerd.sock" || !f.debug || f.action != "start" {
		t.Errorf("start: %+v", f)
	}
	f, err = parseFlags(strings.Fields("-namespace k8s.io -address a -publish-binary b -id abc -bundle /b delete"))
	if err != nil || f.action != "delete" || f.bundle != "/b" || f.debug {
		t.Errorf("delete: %+v, %v", f, err)
	}
	// The server: no action.
	if f, err := parseFlags(strings.Fields("-namespace k8s.io -id abc -address a")); err != nil || f.action != "" {
		t.Errorf("server: %+v, %v", f, err)
	}
}

func TestParseFlagsNamesWhatIsWrong(t *testing.T) {
	for args, want := range map[string]string{
		"-namespace k8s.io -bogus start": "bogus",
		"-namespace k8s.io start delete": "one action",
		"-namespace k8s.io -id":          "-id",
	} {
		_, err := parseFlags(strings.Fields(args))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseFlags(%q) = %v, want an error naming %q", args, err, want)
		}
	}
}

func TestRunRefusesWhatContainerdNeverSends(t *testing.T) {
	if err := run(flags{id: "abc", action: "start"}); err == nil || !strings.Contains(err.Error(), "-namespace") {
		t.Errorf("no namespace: %v", err)
	}
	if err := run(flags{namespace: "k8s.io", id: "abc", action: "stop"}); err == nil || !strings.Contains(err.Error(), `"stop"`) {
		t.Errorf("unknown action: %v", err)
	}
}
