package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// noFile is a Loader whose default file does not exist.
func noFile(t *testing.T) *Loader {
	t.Setenv(EnvVar, "")
	return &Loader{DefaultPath: filepath.Join(t.TempDir(), "absent.toml")}
}

func TestDefaultsWithNoFile(t *testing.T) {
	c, src, warns, err := noFile(t).Load("")
	if err != nil {
		t.Fatal(err)
	}
	if src.Path != "" || src.Origin != OriginBuiltin || src.String() != "built-in defaults" {
		t.Errorf("source = %+v, want built-in defaults", src)
	}
	if len(warns) != 0 {
		t.Errorf("warnings: %v", warns)
	}
	if want := Defaults(); !reflect.DeepEqual(*c, want) {
		t.Errorf("config = %+v, want %+v", *c, want)
	}
	h := c.Hypervisor
	if h.Path != DefaultQEMU || h.Kernel != DefaultKernel || h.Initrd != DefaultInitrd {
		t.Errorf("defaults.toml and the Default* constants disagree: %+v", h)
	}
	if h.MachineType != "q35" || h.DefaultVCPUs != 1 || h.DefaultMemory != 256 ||
		h.SharedFS != "virtio-9p" || h.BlockDeviceDriver != "virtio-blk" {
		t.Errorf("hypervisor defaults: %+v", h)
	}
	if c.Runtime.InternetworkingModel != NetTCFilter || c.Runtime.PrivilegedHostDevices {
		t.Errorf("runtime defaults: %+v", c.Runtime)
	}
	if c.Agent.DialTimeout <= 0 || c.Runtime.CreateContainerTimeout <= 0 {
		t.Errorf("timeouts: %+v %+v", c.Agent, c.Runtime)
	}
}

// The reference file documents only keys Hull reads.
func TestDefaultsTOMLHasNoUnknownKeys(t *testing.T) {
	_, warns, err := Parse("defaults.toml", DefaultsTOML)
	if err != nil || len(warns) != 0 {
		t.Fatalf("err %v, warnings %v", err, warns)
	}
}

func TestFileOverridesOnlyItsKeys(t *testing.T) {
	p := writeFile(t, "config.toml", `
[hypervisor.qemu]
default_memory = 512
kernel_params = "quiet  console=hvc0"

[agent]
kernel_modules = ["virtio_net", "e1000e InterruptThrottleRate=3000"]

[runtime]
internetworking_model = "macvtap"
`)
	c, src, warns, err := noFile(t).Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if src.Path != p || src.Origin != OriginExplicit {
		t.Errorf("source = %+v", src)
	}
	// The one warning: kernel_modules is accepted but not acted on yet.
	if len(warns) != 1 || warns[0].Key != "agent.kernel_modules" || warns[0].Line != 7 {
		t.Errorf("warnings: %v", warns)
	}
	want := Defaults()
	want.Hypervisor.DefaultMemory = 512
	want.Hypervisor.KernelParams = []string{"quiet", "console=hvc0"}
	want.Agent.KernelModules = []string{"virtio_net", "e1000e InterruptThrottleRate=3000"}
	want.Runtime.InternetworkingModel = NetMacvtap
	if !reflect.DeepEqual(*c, want) {
		t.Errorf("config =\n%+v\nwant\n%+v", *c, want)
	}
}

func TestOverrideOrder(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, mem int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("[hypervisor.qemu]\ndefault_memory = "+itoa(mem)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	explicit, env, def := mk("explicit.toml", 128), mk("env.toml", 192), mk("etc.toml", 320)
	l := &Loader{DefaultPath: def}

	for _, tc := range []struct {
		name, explicit, env string
		wantPath, origin    string
		wantMem             int
	}{
		{"explicit beats env and default", explicit, env, explicit, OriginExplicit, 128},
		{"env beats default", "", env, env, OriginEnv, 192},
		{"default file", "", "", def, OriginDefaultPath, 320},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvVar, tc.env)
			c, src, _, err := l.Load(tc.explicit)
			if err != nil {
				t.Fatal(err)
			}
			if src.Path != tc.wantPath || src.Origin != tc.origin || c.Hypervisor.DefaultMemory != tc.wantMem {
				t.Errorf("source %+v memory %d, want %s (%s) memory %d", src, c.Hypervisor.DefaultMemory, tc.wantPath, tc.origin, tc.wantMem)
			}
		})
	}
}

func TestMissingNamedFileIsAnError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.toml")
	l := noFile(t)
	if _, _, _, err := l.Load(missing); err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("explicit: err = %v, want not-exist naming %s", err, missing)
	}
	t.Setenv(EnvVar, missing)
	_, _, _, err := l.Load("")
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), EnvVar) {
		t.Errorf("HULL_CONFIG: err = %v, want one naming %s and %s", err, missing, EnvVar)
	}
}

func TestInvalidValues(t *testing.T) {
	for _, tc := range []struct {
		name, toml string
		want       []string // substrings of the error
	}{
		{"range", "[hypervisor.qemu]\ndefault_memory = 0\n",
			[]string{":2: hypervisor.qemu.default_memory = 0: must be at least 64 (MiB)"}},
		{"tcg cache", "[hypervisor.qemu]\ntcg_cache_size = 4\n",
			[]string{":2: hypervisor.qemu.tcg_cache_size = 4: must be at least 8 (MiB)"}},
		{"range high", "[hypervisor.qemu]\ndefault_vcpus = 300\n",
			[]string{"hypervisor.qemu.default_vcpus = 300: must be at most 255"}},
		{"maxmemory below memory", "[hypervisor.qemu]\ndefault_memory = 512\ndefault_maxmemory = 256\n",
			[]string{":3: hypervisor.qemu.default_maxmemory = 256: must be 0 (the host's memory) or from default_memory (512) to 1048576 (MiB)"}},
		{"maxvcpus below vcpus", "[hypervisor.qemu]\ndefault_vcpus = 4\ndefault_maxvcpus = 2\n",
			[]string{":3: hypervisor.qemu.default_maxvcpus = 2: must be 0 (the number of host CPUs) or from default_vcpus (4) to 255"}},
		{"timeout", "[agent]\ndial_timeout = -1\n",
			[]string{"agent.dial_timeout = -1: must be at least 1 (seconds)"}},
		{"enum", "[hypervisor.qemu]\nshared_fs = \"virtiofs\"\n",
			[]string{`hypervisor.qemu.shared_fs = "virtiofs": must be one of "virtio-9p", "virtio-fs", "none"`}},
		{"enum network", "[runtime]\ninternetworking_model = \"bridged\"\n",
			[]string{`runtime.internetworking_model = "bridged": must be one of "tcfilter", "macvtap", "none"`}},
		{"enum machine", "[hypervisor.qemu]\nmachine_type = \"virt\"\n",
			[]string{`hypervisor.qemu.machine_type = "virt": must be one of "q35", "pc", "microvm"`}},
		{"relative kernel", "[hypervisor.qemu]\nkernel = \"guest/vmlinux\"\n",
			[]string{`:2: hypervisor.qemu.kernel = "guest/vmlinux": must be an absolute path`}},
		{"relative qemu", "[hypervisor.qemu]\npath = \"./qemu\"\n",
			[]string{`hypervisor.qemu.path = "./qemu": must be an absolute path or a command name`}},
		{"virtio-fs without daemon", "[hypervisor.qemu]\nshared_fs = \"virtio-fs\"\nvirtio_fs_daemon = \"\"\n",
			[]string{`hypervisor.qemu.virtio_fs_daemon = "": must be an absolute path`}},
		{"bad module", "[agent]\nkernel_modules = [\"../evil\"]\n",
			[]string{`agent.kernel_modules = ["../evil"]: entry "../evil" must be a module name`}},
		{"experimental", "[runtime]\nexperimental = [\"newstore\"]\n",
			[]string{`runtime.experimental = ["newstore"]: unknown feature "newstore"`}},
		{"wrong type int", "[hypervisor.qemu]\ndefault_memory = \"2048\"\n",
			[]string{`:2: hypervisor.qemu.default_memory = "2048": must be an integer`}},
		{"wrong type string", "[hypervisor.qemu]\nkernel = 42\n",
			[]string{`hypervisor.qemu.kernel = 42: must be a string`}},
		{"wrong type bool", "[runtime]\nsandbox_cgroup_only = \"yes\"\n",
			[]string{`runtime.sandbox_cgroup_only = "yes": must be true or false`}},
		{"wrong type list", "[agent]\nkernel_modules = \"virtio_net\"\n",
			[]string{`agent.kernel_modules = "virtio_net": must be a list of strings`}},
		{"kernel_params as list", "[hypervisor.qemu]\nkernel_params = [\"quiet\"]\n",
			[]string{`hypervisor.qemu.kernel_params = ["quiet"]: must be a string of space-separated parameters`}},
		{"syntax", "[hypervisor.qemu]\ndefault_memory = = 3\n",
			[]string{":2: invalid TOML:"}},
		{"two errors", "[hypervisor.qemu]\ndefault_memory = 1\n[runtime]\ncreate_container_timeout = 0\n",
			[]string{"hypervisor.qemu.default_memory = 1:", ":4: runtime.create_container_timeout = 0: must be at least 1 (seconds)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, "config.toml", tc.toml)
			c, _, _, err := noFile(t).Load(p)
			if err == nil {
				t.Fatalf("loaded %+v, want an error", c)
			}
			if !strings.HasPrefix(err.Error(), p) {
				t.Errorf("error %q does not start with the file name", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Errorf("error %v is not a *config.Error", err)
			}
		})
	}
}

func TestUnknownKeyWarns(t *testing.T) {
	p := writeFile(t, "config.toml", `# comment
[hypervisor.qemu]
default_memory = 512
default_memroy = 1024

[runtime]
sandbox_bind_mounts = [
  "/etc/a=b",
]
enable_debug = true
`)
	c, _, warns, err := noFile(t).Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Hypervisor.DefaultMemory != 512 || !c.Runtime.EnableDebug {
		t.Errorf("known keys not applied: %+v", c)
	}
	if len(warns) != 2 {
		t.Fatalf("warnings = %v, want 2", warns)
	}
	w := warns[0]
	if w.Key != "hypervisor.qemu.default_memroy" || w.Line != 4 || !strings.Contains(w.Msg, "did you mean default_memory?") {
		t.Errorf("warning = %+v", w)
	}
	if got, want := w.String(), p+":4: hypervisor.qemu.default_memroy: unknown key, ignored"; !strings.HasPrefix(got, want) {
		t.Errorf("warning text %q, want prefix %q", got, want)
	}
	if w := warns[1]; w.Key != "runtime.sandbox_bind_mounts" || w.Line != 7 {
		t.Errorf("warning = %+v", w)
	}
}

func TestKataFileLoadsWithWarnings(t *testing.T) {
	p, err := filepath.Abs("testdata/kata-configuration.toml")
	if err != nil {
		t.Fatal(err)
	}
	c, _, warns, err := noFile(t).Load(p)
	if err != nil {
		t.Fatalf("kata file: %v", err)
	}
	h := c.Hypervisor
	if h.Path != "/usr/bin/qemu-system-x86_64" || h.DefaultMemory != 2048 || h.SharedFS != "virtio-fs" ||
		h.BlockDeviceDriver != "virtio-scsi" || h.VirtioFSDaemon != "/usr/libexec/virtiofsd" ||
		!reflect.DeepEqual(h.KernelParams, []string{"cgroup_no_v1=all", "systemd.unified_cgroup_hierarchy=1"}) {
		t.Errorf("hypervisor = %+v", h)
	}
	if c.Agent.DialTimeout != 45 {
		t.Errorf("agent.kata.dial_timeout not applied to agent: %+v", c.Agent)
	}
	byKey := map[string]Warning{}
	for _, w := range warns {
		byKey[w.Key] = w
	}
	for key, line := range map[string]int{
		"hypervisor.qemu.image":                  7,
		"hypervisor.qemu.valid_hypervisor_paths": 12,
		"hypervisor.qemu.enable_iommu":           45,
		"factory.template_path":                  69,
		"agent.kata.debug_console_enabled":       77,
		"runtime.sandbox_bind_mounts":            89,
	} {
		w, ok := byKey[key]
		if !ok {
			t.Errorf("no warning for %s", key)
			continue
		}
		if w.Line != line {
			t.Errorf("warning for %s at line %d, want %d", key, w.Line, line)
		}
	}
	// [factory] is Hull's too: enable_template applies, Kata's other
	// factory keys warn one by one.
	if c.Factory.EnableTemplate {
		t.Errorf("factory.enable_template = false in the file, got %+v", c.Factory)
	}
	// Known keys never warn.
	for _, k := range []string{"hypervisor.qemu.kernel", "agent.kata.dial_timeout", "runtime.experimental", "factory.enable_template"} {
		if w, ok := byKey[k]; ok {
			t.Errorf("warning for a known key: %+v", w)
		}
	}
}

func TestAgentKataAlias(t *testing.T) {
	p := writeFile(t, "config.toml", "[agent]\ndial_timeout = 10\n\n[agent.kata]\ndial_timeout = 45\nenable_debug = true\n")
	c, _, warns, err := noFile(t).Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Agent.DialTimeout != 10 || !c.Agent.EnableDebug {
		t.Errorf("agent = %+v, want dial_timeout from [agent] and enable_debug from [agent.kata]", c.Agent)
	}
	if len(warns) != 1 || warns[0].Key != "agent.kata.dial_timeout" || warns[0].Line != 5 {
		t.Errorf("warnings = %v, want one about agent.kata.dial_timeout at line 5", warns)
	}
}

func TestTopLevelAndDottedUnknowns(t *testing.T) {
	p := writeFile(t, "config.toml", "stray = 1\nimage.service_offload = true\n[hypervisor.clh]\npath = \"/usr/bin/cloud-hypervisor\"\n")
	_, _, warns, err := noFile(t).Load(p)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, w := range warns {
		got[w.Key] = w.Line
	}
	want := map[string]int{"stray": 1, "[image]": 2, "[hypervisor.clh]": 3}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("warnings %v, want keys and lines %v", warns, want)
	}
}

func TestKeyLines(t *testing.T) {
	doc := `a = 1 # x = 2
[t]
"quoted.key" = "v = w"
s = """
fake = 1
"""
l = [
  "b = 2", # c = 3
  { d = 4 },
]
[[arr]]
e.f = 'x'
`
	got := keyLines([]byte(doc))
	want := map[string]int{"a": 1, "t": 2, "t.quoted.key": 3, "t.s": 4, "t.l": 7, "arr": 11, "arr.e.f": 12}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("keyLines = %v, want %v", got, want)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestTOMLRoundTrip(t *testing.T) {
	c := Defaults()
	c.Hypervisor.KernelParams = []string{"quiet", "tsc=reliable"}
	c.Hypervisor.DefaultMemory = 1024
	c.Agent.KernelModules = []string{"virtio_net"}
	c.Runtime.EnableDebug = true
	got, warns, err := Parse("roundtrip", []byte(c.TOML()))
	if err != nil || len(warns) != 1 || warns[0].Key != "agent.kernel_modules" {
		t.Fatalf("err %v warnings %v in\n%s", err, warns, c.TOML())
	}
	if !reflect.DeepEqual(*got, c) {
		t.Errorf("round trip:\n%+v\nwant\n%+v", *got, c)
	}
}

func TestKeysWithNoEffectYetWarn(t *testing.T) {
	_, warns, err := Parse("kata.toml", []byte("[hypervisor.qemu]\nshared_fs = \"virtio-fs\"\n\n[runtime]\nsandbox_cgroup_only = false\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, w := range warns {
		got[w.Key] = w.Line
	}
	if got["hypervisor.qemu.shared_fs"] != 2 || got["runtime.sandbox_cgroup_only"] != 5 || len(got) != 2 {
		t.Fatalf("warnings = %v", warns)
	}
}
