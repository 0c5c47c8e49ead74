package harness

import (
	"testing"

	"github.com/BurntSushi/toml"
)

// The generated containerd configuration is valid TOML and has each Hull
// handler with its ConfigPath and host-device setting.
func TestConfigHandlers(t *testing.T) {
	for name, plugin := range map[string]string{"1.6": "io.containerd.grpc.v1.cri", "1.7": "io.containerd.grpc.v1.cri", "2.4": "io.containerd.cri.v1.runtime"} {
		t.Run(name, func(t *testing.T) {
			v, err := LookupVersion(name)
			if err != nil {
				t.Fatal(err)
			}
			testConfigHandlers(t, v, plugin)
		})
	}
}

func testConfigHandlers(t *testing.T, v Version, plugin string) {
	c := &Containerd{Dir: "/d", Root: "/d/root", State: "/d/state", opts: Options{Version: v,
		HullConfig: "/c/hull.toml", BrokenHullConfig: "/c/broken.toml", FailpointShim: "/bin/fp",
		HullHandlers:       map[string]string{"hull-macvtap": "/c/m.toml"},
		HostDeviceHandlers: map[string]string{"hull-hostdevs": "/c/h.toml"},
	}}
	var cfg struct {
		Version int `toml:"version"`
		Plugins map[string]struct {
			Containerd struct {
				Runtimes map[string]struct {
					RuntimeType                  string   `toml:"runtime_type"`
					RuntimePath                  string   `toml:"runtime_path"`
					PrivilegedWithoutHostDevices bool     `toml:"privileged_without_host_devices"`
					PodAnnotations               []string `toml:"pod_annotations"`
					Options                      struct {
						ConfigPath string
					} `toml:"options"`
				} `toml:"runtimes"`
			} `toml:"containerd"`
		} `toml:"plugins"`
	}
	if _, err := toml.Decode(c.config(), &cfg); err != nil {
		t.Fatalf("config is not TOML: %v\n%s", err, c.config())
	}
	if want := map[int]int{1: 2, 2: 3}[v.Major()]; cfg.Version != want {
		t.Errorf("config version %d, want %d", cfg.Version, want)
	}
	rt := cfg.Plugins[plugin].Containerd.Runtimes
	want := map[string]struct {
		config       string
		noHostDevice bool
	}{
		HandlerHull: {"/c/hull.toml", true}, HandlerHullBroken: {"/c/broken.toml", true},
		HandlerHullFailpoints: {"/c/hull.toml", true}, "hull-macvtap": {"/c/m.toml", true},
		"hull-hostdevs": {"/c/h.toml", false},
	}
	for name, w := range want {
		h, ok := rt[name]
		if !ok || h.RuntimeType != HullRuntimeType || h.Options.ConfigPath != w.config || h.PrivilegedWithoutHostDevices != w.noHostDevice {
			t.Errorf("handler %s = %+v (present %v), want config %s, privileged_without_host_devices %v", name, h, ok, w.config, w.noHostDevice)
		}
	}
	if fp := rt[HandlerHullFailpoints]; fp.RuntimePath != "/bin/fp" || len(fp.PodAnnotations) != 1 || fp.PodAnnotations[0] != FailpointAnnotation {
		t.Errorf("failpoint handler = %+v", fp)
	}
	if rt[HandlerRunc].RuntimeType != "io.containerd.runc.v2" {
		t.Errorf("runc handler = %+v", rt[HandlerRunc])
	}
}

// deploy/'s snippets put the hull handler where each containerd major
// version reads it (the same tables the harness writes).
func TestDeploySnippets(t *testing.T) {
	for file, plugin := range map[string]string{
		"../../../deploy/containerd-hull.toml":    "io.containerd.grpc.v1.cri",
		"../../../deploy/containerd-hull-v3.toml": "io.containerd.cri.v1.runtime",
	} {
		var cfg struct {
			Plugins map[string]struct {
				Containerd struct {
					Runtimes map[string]struct {
						RuntimeType string `toml:"runtime_type"`
						Options     struct{ ConfigPath string }
					}
				}
			}
		}
		if _, err := toml.DecodeFile(file, &cfg); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		h := cfg.Plugins[plugin].Containerd.Runtimes["hull"]
		if h.RuntimeType != HullRuntimeType || h.Options.ConfigPath == "" {
			t.Errorf("%s: handler hull in %s = %+v", file, plugin, h)
		}
	}
}
