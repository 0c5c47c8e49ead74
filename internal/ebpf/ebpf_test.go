package ebpf

import (
	"bytes"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// struct bpf_insn: code, dst_reg:4 | src_reg:4, off (s16), imm (s32).
func TestEncode(t *testing.T) {
	got := Encode([]Insn{{Code: 0x61, Dst: 2, Src: 1, Off: -4, Imm: -2}, {Code: 0x95}})
	want := []byte{0x61, 0x12, 0xfc, 0xff, 0xfe, 0xff, 0xff, 0xff, 0x95, 0, 0, 0, 0, 0, 0, 0}
	if !bytes.Equal(got, want) {
		t.Errorf("Encode = % x\nwant     % x", got, want)
	}
}

// A program the verifier refuses fails with the verifier's reason.
func TestLoadRefusedCarriesTheVerifierLog(t *testing.T) {
	// r0 is read before it is written: "R0 !read_ok".
	_, err := Load(unix.BPF_PROG_TYPE_CGROUP_DEVICE, unix.BPF_CGROUP_DEVICE, "hull_test", []Insn{{Code: unix.BPF_JMP | unix.BPF_EXIT}})
	if err == nil {
		t.Fatal("an exit without r0 loaded")
	}
	if !strings.Contains(err.Error(), "hull_test") || (!strings.Contains(err.Error(), "R0") && !strings.Contains(err.Error(), "operation not permitted")) {
		t.Errorf("error without the program's name or the verifier's reason: %v", err)
	}
	if _, err := Load(unix.BPF_PROG_TYPE_CGROUP_DEVICE, unix.BPF_CGROUP_DEVICE, "hull_test", nil); err == nil {
		t.Error("an empty program loaded")
	}
}
