# Hull's QEMU (hack/build-qemu.sh, docs/qemu.md): the devices of
# qemu-system-x86_64 built with --without-default-devices. Every symbol
# here is one Hull's machines or arguments need; what they select comes
# with them. TestQEMUHasHullsDevices (internal/vm/qemu) checks the result.

# Machine types (internal/vm/qemu Machines): q35 (the default), pc, microvm.
CONFIG_Q35=y
CONFIG_I440FX=y
CONFIG_MICROVM=y
# q35 implies it and the default build has it; without it the guest ticks
# on the PIT when idle.
CONFIG_HPET=y
# The console (-serial on ttyS0).
CONFIG_SERIAL_ISA=y
# q35's hotplug root ports (pcie-root-port).
CONFIG_PCIE_PORT=y

# The virtio devices, as PCI (q35, pc) and MMIO (microvm) devices.
CONFIG_VIRTIO_PCI=y
CONFIG_VIRTIO_MMIO=y
CONFIG_VIRTIO_SERIAL=y
CONFIG_VIRTIO_RNG=y
CONFIG_VIRTIO_BALLOON=y
CONFIG_VIRTIO_NET=y
CONFIG_VIRTIO_9P=y
# Hotplugged disks: virtio-blk-pci, and virtio-scsi-pci with scsi-hd.
CONFIG_VIRTIO_BLK=y
CONFIG_VIRTIO_SCSI=y
