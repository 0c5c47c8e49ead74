package sandbox

import (
	"strconv"
)

// CRI's sizing annotations on the sandbox container (containerd >= 1.7;
// 1.6 sets none of them and the configured defaults apply).
const (
	AnnotationCPUQuota  = "io.kubernetes.cri.sandbox-cpu-quota"
	AnnotationCPUPeriod = "io.kubernetes.cri.sandbox-cpu-period"
	AnnotationMemory    = "io.kubernetes.cri.sandbox-memory"
)

// Size returns the VM's vCPUs and memory (MiB) for a sandbox: the
// configured defaults, which are the guest's own overhead, plus what the
// pod's limits ask for (CPU quota / period rounded up, memory in bytes
// rounded up to MiB). maxVCPUs (> 0) caps the vCPUs.
func Size(annotations map[string]string, defVCPUs, defMemMiB, maxVCPUs int) (vcpus, memMiB int) {
	vcpus, memMiB = defVCPUs, defMemMiB
	quota, _ := strconv.ParseInt(annotations[AnnotationCPUQuota], 10, 64)
	period, _ := strconv.ParseInt(annotations[AnnotationCPUPeriod], 10, 64)
	if quota > 0 && period > 0 {
		vcpus += int((quota + period - 1) / period)
	}
	if maxVCPUs > 0 && vcpus > maxVCPUs {
		vcpus = maxVCPUs
	}
	if mem, err := strconv.ParseInt(annotations[AnnotationMemory], 10, 64); err == nil && mem > 0 {
		memMiB += int((mem + (1<<20 - 1)) >> 20)
	}
	return vcpus, memMiB
}
