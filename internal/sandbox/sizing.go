package sandbox

import (
	"fmt"
	"strconv"
)

// CRI's sizing annotations on the sandbox container (containerd >= 1.7;
// 1.6 sets none of them and the configured defaults apply).
const (
	AnnotationCPUQuota  = "io.kubernetes.cri.sandbox-cpu-quota"
	AnnotationCPUPeriod = "io.kubernetes.cri.sandbox-cpu-period"
	AnnotationMemory    = "io.kubernetes.cri.sandbox-memory"
)

// Limits are the configured sizes a VM starts from and may not exceed
// (hypervisor.qemu keys, Kata's names).
type Limits struct {
	DefaultVCPUs     int // default_vcpus
	DefaultMemoryMiB int // default_memory
	MaxVCPUs         int // default_maxvcpus, resolved (> 0)
	MaxMemoryMiB     int // default_maxmemory, resolved (> 0)
}

// Size returns the VM's vCPUs and memory (MiB) for a sandbox: the
// configured defaults, which are the guest's own overhead, plus what the
// pod's limits ask for (CPU quota / period rounded up, memory in bytes
// rounded up to MiB). A size above the caps is an error naming the
// request and the cap: the VM is never silently made smaller than the
// pod asked for. An annotation that is not an integer is an error; zero
// or negative means no limit.
func Size(annotations map[string]string, l Limits) (vcpus, memMiB int, err error) {
	quota, err := intAnnotation(annotations, AnnotationCPUQuota)
	if err != nil {
		return 0, 0, err
	}
	period, err := intAnnotation(annotations, AnnotationCPUPeriod)
	if err != nil {
		return 0, 0, err
	}
	mem, err := intAnnotation(annotations, AnnotationMemory)
	if err != nil {
		return 0, 0, err
	}
	vcpus, memMiB = l.DefaultVCPUs, l.DefaultMemoryMiB
	var podCPUs, podMiB int64
	if quota > 0 && period > 0 {
		podCPUs = (quota + period - 1) / period
	}
	if mem > 0 {
		podMiB = (mem + (1<<20 - 1)) >> 20
	}
	if l.MaxVCPUs > 0 && int64(vcpus)+podCPUs > int64(l.MaxVCPUs) {
		return 0, 0, fmt.Errorf("sizing the VM: %d vCPUs (default_vcpus %d + %d for %s %d / %s %d) exceed hypervisor.qemu.default_maxvcpus %d",
			int64(vcpus)+podCPUs, vcpus, podCPUs, AnnotationCPUQuota, quota, AnnotationCPUPeriod, period, l.MaxVCPUs)
	}
	if l.MaxMemoryMiB > 0 && int64(memMiB)+podMiB > int64(l.MaxMemoryMiB) {
		return 0, 0, fmt.Errorf("sizing the VM: %d MiB of memory (default_memory %d + %d for %s %d bytes) exceed hypervisor.qemu.default_maxmemory %d MiB",
			int64(memMiB)+podMiB, memMiB, podMiB, AnnotationMemory, mem, l.MaxMemoryMiB)
	}
	return vcpus + int(podCPUs), memMiB + int(podMiB), nil
}

// intAnnotation is annotation key as an integer, 0 when absent or empty.
func intAnnotation(annotations map[string]string, key string) (int64, error) {
	v, ok := annotations[key]
	if !ok || v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("sizing the VM: annotation %s = %q is not an integer", key, v)
	}
	return n, nil
}
