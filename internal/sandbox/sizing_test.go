package sandbox

import (
	"strings"
	"testing"
)

func TestSize(t *testing.T) {
	lim := Limits{DefaultVCPUs: 1, DefaultMemoryMiB: 256, MaxVCPUs: 8, MaxMemoryMiB: 2048}
	for _, tc := range []struct {
		name      string
		ann       map[string]string
		vcpu, mem int
	}{
		{"no annotations", nil, 1, 256},
		{"quota", map[string]string{AnnotationCPUQuota: "150000", AnnotationCPUPeriod: "100000"}, 3, 256},
		{"quota at the cap", map[string]string{AnnotationCPUQuota: "700000", AnnotationCPUPeriod: "100000"}, 8, 256},
		{"memory rounds up", map[string]string{AnnotationMemory: "134217729"}, 1, 256 + 129},
		{"memory at the cap", map[string]string{AnnotationMemory: "1879048192"}, 1, 2048},
		{"no limits", map[string]string{AnnotationCPUQuota: "-1", AnnotationCPUPeriod: "0", AnnotationMemory: "0"}, 1, 256},
	} {
		v, m, err := Size(tc.ann, lim)
		if err != nil || v != tc.vcpu || m != tc.mem {
			t.Errorf("%s: Size = %d vCPUs, %d MiB, %v; want %d, %d", tc.name, v, m, err, tc.vcpu, tc.mem)
		}
	}
}

// A request above a cap fails naming the value and the cap; it is never
// clamped.
func TestSizeOverTheCapFails(t *testing.T) {
	lim := Limits{DefaultVCPUs: 1, DefaultMemoryMiB: 256, MaxVCPUs: 4, MaxMemoryMiB: 1024}
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want []string
	}{
		{"vcpus", map[string]string{AnnotationCPUQuota: "1600000", AnnotationCPUPeriod: "100000"},
			[]string{"17 vCPUs", "default_maxvcpus 4", AnnotationCPUQuota + " 1600000"}},
		{"memory", map[string]string{AnnotationMemory: "1073741824"},
			[]string{"1280 MiB", "default_maxmemory 1024 MiB", AnnotationMemory + " 1073741824"}},
		{"garbage", map[string]string{AnnotationMemory: "lots"}, []string{AnnotationMemory, `"lots"`}},
	} {
		v, m, err := Size(tc.ann, lim)
		if err == nil {
			t.Errorf("%s: Size = %d vCPUs, %d MiB, no error", tc.name, v, m)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not name %q", tc.name, err, w)
			}
		}
	}
}
