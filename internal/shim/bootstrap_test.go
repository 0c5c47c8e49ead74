package shim

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/containerd/containerd/api/types"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// encodeParams writes BootstrapParams as containerd 2.4 does
// (core/runtime/v2/command.go), an extension included.
func encodeParams(id, ns string, level int32) []byte {
	var b []byte
	str := func(num protowire.Number, v string) {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendString(b, v)
	}
	str(1, id)
	str(2, ns)
	b = protowire.AppendTag(b, 3, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(int64(level)))
	str(4, "v2.4.2")
	str(5, "/run/containerd/containerd.sock.ttrpc")
	str(6, "/run/containerd/containerd.sock")
	str(7, "/usr/bin/containerd")
	var ext []byte
	ext = protowire.AppendTag(ext, 1, protowire.BytesType)
	ext = protowire.AppendBytes(ext, []byte("\x0a\x05x.y/Z"))
	b = protowire.AppendTag(b, 8, protowire.BytesType)
	b = protowire.AppendBytes(b, ext)
	str(9, "/run/containerd/s")
	return b
}

func TestParseBootstrapParams(t *testing.T) {
	p, err := parseBootstrapParams(encodeParams("pod1", "k8s.io", -4), "pod1", "k8s.io")
	if err != nil {
		t.Fatal(err)
	}
	want := bootstrapParams{InstanceID: "pod1", Namespace: "k8s.io", LogLevel: -4,
		TTRPCAddress: "/run/containerd/containerd.sock.ttrpc", GRPCAddress: "/run/containerd/containerd.sock", SocketDir: "/run/containerd/s"}
	if *p != want {
		t.Fatalf("parsed %+v, want %+v", *p, want)
	}
	if !p.Debug() {
		t.Error("log level -4 (debug) not seen as debug")
	}
}

// What containerd 1.x writes on stdin, or another instance's parameters,
// is not this shim's bootstrap: the legacy path serves it.
func TestParseBootstrapParamsLegacy(t *testing.T) {
	var legacyAny []byte
	legacyAny = protowire.AppendTag(legacyAny, 1, protowire.BytesType)
	legacyAny = protowire.AppendString(legacyAny, "runtimeoptions.v1.Options")
	legacyAny = protowire.AppendTag(legacyAny, 2, protowire.BytesType)
	legacyAny = protowire.AppendBytes(legacyAny, []byte("\x12\x04/etc"))
	for name, in := range map[string][]byte{
		"empty":          nil,
		"runtime opts":   legacyAny,
		"other instance": encodeParams("pod2", "k8s.io", 0),
		"garbage":        []byte("\xff\xff"),
	} {
		if _, err := parseBootstrapParams(in, "pod1", "k8s.io"); !errors.Is(err, errNotBootstrap) {
			t.Errorf("%s: got %v, want errNotBootstrap", name, err)
		}
	}
}

func TestBootstrapStartIgnoresOtherActions(t *testing.T) {
	for _, args := range [][]string{
		{"-namespace", "k8s.io", "-id", "pod1", "delete"},
		{"-namespace", "k8s.io", "-id", "pod1"},
	} {
		f, err := parseFlags(args)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		handled, err := bootstrapStart(f, bytes.NewReader(encodeParams("pod1", "k8s.io", 0)), &out)
		if handled || err != nil || out.Len() > 0 {
			t.Errorf("%q: handled %v, err %v, wrote %q", args, handled, err, out.String())
		}
	}
	// A command line that does not parse never reaches it (Run refuses it).
	if _, err := parseFlags([]string{"-namespace", "k8s.io", "-id", "pod1", "-unknown", "start"}); err == nil {
		t.Error("an unknown flag parsed")
	}
	// start with 1.x's stdin: the legacy path.
	handled, err := bootstrapStart(flags{namespace: "k8s.io", id: "pod1", action: "start"}, bytes.NewReader(nil), &bytes.Buffer{})
	if handled || err != nil {
		t.Errorf("start without parameters: handled %v, err %v", handled, err)
	}
}

func TestMarshalBootstrapResult(t *testing.T) {
	b := marshalBootstrapResult("unix:///run/containerd/s/abc")
	got := map[protowire.Number]any{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		b = b[n:]
		if typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			got[num], b = v, b[n:]
		} else {
			v, n := protowire.ConsumeString(b)
			got[num], b = v, b[n:]
		}
	}
	if got[1] != uint64(2) || got[2] != "unix:///run/containerd/s/abc" || got[3] != "ttrpc" {
		t.Fatalf("BootstrapResult fields %v", got)
	}
}

func TestRuntimeInfo(t *testing.T) {
	var out bytes.Buffer
	if err := writeRuntimeInfo(bytes.NewReader([]byte("\x0a\x03a/b")), &out); err != nil {
		t.Fatal(err)
	}
	var info types.RuntimeInfo
	if err := proto.Unmarshal(out.Bytes(), &info); err != nil {
		t.Fatal(err)
	}
	if info.Name != RuntimeName || info.Version.GetVersion() == "" {
		t.Fatalf("name %q version %v", info.Name, info.Version)
	}
	if info.Features.GetTypeUrl() != featuresTypeURL {
		t.Fatalf("features type %q", info.Features.GetTypeUrl())
	}
	var f struct {
		OCIVersionMax string
		MountOptions  []string
		Linux         struct{ Namespaces []string }
	}
	if err := json.Unmarshal(info.Features.Value, &f); err != nil {
		t.Fatal(err)
	}
	if f.OCIVersionMax == "" || !slices.Contains(f.MountOptions, "ro") || !slices.Contains(f.MountOptions, "rbind") || !slices.Contains(f.MountOptions, "rro") {
		t.Errorf("features %+v", f)
	}
	// Not implemented in the guest: must not be advertised.
	if slices.Contains(f.Linux.Namespaces, "user") {
		t.Errorf("features advertise what the guest lacks: %+v", f)
	}
}

func TestInfoFlag(t *testing.T) {
	for args, want := range map[string]bool{"-info": true, "--info": true, "-id x start": false, "-- -info": false} {
		var a []string
		for _, f := range bytes.Fields([]byte(args)) {
			a = append(a, string(f))
		}
		if f, err := parseFlags(a); err != nil || f.info != want {
			t.Errorf("parseFlags(%q).info = %v, %v", args, f.info, err)
		}
	}
}
