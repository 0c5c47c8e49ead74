package harness

import (
	"testing"

	"github.com/BurntSushi/toml"
)

// The generated containerd configuration is valid TOML and has each Hull
// handler with its ConfigPath and host-device setting.
func TestConfigHandlers(t *testing.T) {
	c := &Containerd{Dir: "/d", Root: "/d/root", State: "/d/state", opts: Options{
		HullConfig: "/c/hull.toml", BrokenHullConfig: "/c/broken.toml", FailpointShim: "/bin/fp",
		HullHandlers:       map[string]string{"hull-macvtap": "/c/m.toml"},
		HostDeviceHandlers: map[string]string{"hull-hostdevs": "/c/h.toml"},
	}}
	var cfg struct {
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
	rt := cfg.Plugins["io.containerd.grpc.v1.cri"].Containerd.Runtimes
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
