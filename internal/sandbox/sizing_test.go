package sandbox

import "testing"

func TestSize(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ann       map[string]string
		max       int
		vcpu, mem int
	}{
		{"no annotations", nil, 8, 1, 256},
		{"quota", map[string]string{AnnotationCPUQuota: "150000", AnnotationCPUPeriod: "100000"}, 8, 3, 256},
		{"quota capped", map[string]string{AnnotationCPUQuota: "1600000", AnnotationCPUPeriod: "100000"}, 4, 4, 256},
		{"memory rounds up", map[string]string{AnnotationMemory: "134217729"}, 8, 1, 256 + 129},
		{"garbage ignored", map[string]string{AnnotationCPUQuota: "x", AnnotationCPUPeriod: "0", AnnotationMemory: "-5"}, 8, 1, 256},
	} {
		v, m := Size(tc.ann, 1, 256, tc.max)
		if v != tc.vcpu || m != tc.mem {
			t.Errorf("%s: Size = %d vCPUs, %d MiB; want %d, %d", tc.name, v, m, tc.vcpu, tc.mem)
		}
	}
}
