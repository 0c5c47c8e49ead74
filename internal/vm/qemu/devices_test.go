package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/testenv"
	"github.com/hull-runtime/hull/internal/vm"
)

// TestQEMUHasHullsDevices asks the QEMU an empty Binary runs (Hull's own
// under make test, docs/qemu.md; Debian's without it) for every machine
// type Hull accepts and every type its arguments and disk hotplug name,
// and the HPET: Hull's build has only the devices of
// guest/qemu/hull-devices.mak, and one missing there fails a pod at
// its QEMU's start (or, the HPET, only costs its idle CPU).
func TestQEMUHasHullsDevices(t *testing.T) {
	bin := DefaultBinary()
	testenv.Require(t, testenv.Bins(bin))
	if want := os.Getenv("HULL_TEST_QEMU"); want != "" && bin != want {
		t.Fatalf("the QEMU in effect is %s, want %s (HULL_TEST_QEMU)", bin, want)
	}
	machines, types := qemuTypes(t, bin)
	for _, m := range Machines {
		if !slices.Contains(machines, m) {
			t.Errorf("%s has no machine type %s (it has %v)", bin, m, machines)
		}
	}
	for _, ty := range hullTypes() {
		if !slices.Contains(types, ty) {
			t.Errorf("%s has no type %s (guest/qemu/hull-devices.mak)", bin, ty)
		}
	}
}

// hullTypes are the QOM types Hull's QEMUs create: each -device driver
// and -object type of every machine's arguments (shares, NICs, a
// template's memory file), the disks it hotplugs (disk.go), the console's
// serial port and the HPET.
func hullTypes() []string {
	types := []string{"virtio-blk-pci", "virtio-scsi-pci", "scsi-hd", "isa-serial", "hpet"}
	for _, m := range Machines {
		for _, mem := range []*vm.MemoryFile{nil, {Path: "/t/memory", Shared: true}} {
			cfg := baseConfig()
			cfg.MachineType, cfg.Memory = m, mem
			cfg.Shares = []vm.Share{{Tag: "rootfs", HostPath: "/run/hull/pod1/shared"}}
			cfg.NICs = []vm.NIC{{ID: "net0", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, TapFile: os.Stdin}}
			args := BuildArgs(cfg, AccelTCG)
			for i := 0; i+1 < len(args); i++ {
				if args[i] == "-device" || args[i] == "-object" {
					ty, _, _ := strings.Cut(args[i+1], ",")
					if !slices.Contains(types, ty) {
						types = append(types, ty)
					}
				}
			}
		}
	}
	return types
}

// qemuTypes runs bin with no machine and asks it over QMP (on its
// stdin) for its machine types (names and aliases) and its types.
func qemuTypes(t *testing.T, bin string) (machines, types []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-machine", "none", "-nodefaults", "-no-user-config", "-display", "none", "-qmp", "stdio")
	cmd.Stdin = strings.NewReader(`{"execute":"qmp_capabilities"}` + "\n" +
		`{"execute":"query-machines","id":"machines"}` + "\n" +
		`{"execute":"qom-list-types","id":"types"}` + "\n" +
		`{"execute":"quit"}` + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, stderr.String())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var reply struct {
			ID     string          `json:"id"`
			Return json.RawMessage `json:"return"`
		}
		if json.Unmarshal(sc.Bytes(), &reply) != nil {
			continue
		}
		var named []struct{ Name, Alias string }
		switch reply.ID {
		case "machines", "types":
			if err := json.Unmarshal(reply.Return, &named); err != nil {
				t.Fatalf("%s: %s: %v", bin, reply.ID, err)
			}
		}
		for _, n := range named {
			if reply.ID == "machines" {
				machines = append(machines, n.Name, n.Alias)
			} else {
				types = append(types, n.Name)
			}
		}
	}
	if len(machines) == 0 || len(types) == 0 {
		t.Fatalf("%s answered no machine types or no types over QMP:\n%s", bin, out)
	}
	return machines, types
}
