"""The kinds of fault the hardware detectors (gpu_hw_error, node_health) declare, and which category is which.

Both detectors group kernel-log, nvidia-smi and DCGM events into episodes with a ``category``; what an episode
means for an incident (a GPU fault, a fault of the host, a NIC fault, or an event that explains nothing) is
decided here, once, from the category and the root Xid.
"""

from __future__ import annotations

from forensics.base.findings import FindingKind, Role

#: Xids that mean the GPU (or its link) is gone or unusable for the job: fallen off the bus, double-bit
#: ECC, uncontained / contained ECC, row-remap failure, NVLink errors, GSP timeouts.
GPU_FAULT_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 143, 144, 145, 149})
#: categories that are a GPU fault whatever the Xid.
GPU_FAULT_CATEGORIES = frozenset({"fallen_off_bus", "gpu_init_failed", "nvlink", "nvlink5", "gsp", "aer", "nvswitch",
                                  "nvidia_smi"})
#: host-side faults: storage hangs (hung tasks), lockups, host memory errors, the OOM killer, CPU throttling,
#: filesystem / block-device errors, the node shutting down or panicking (node_health's categories).
HOST_FAULT_CATEGORIES = frozenset({"hung", "lockup", "edac", "oom", "storage", "host_memory", "cpu_thermal",
                                   "fs_error", "shutdown"})
#: platform errors logged with the GPU's faults: firmware-first (GHES) and machine-check reports.
PLATFORM_ERROR_CATEGORIES = frozenset({"ghes", "mce"})
#: NIC faults on a host: IB port / Ethernet link flaps (node_health `nic_link`), mlx5 errors, carrier loss.
NIC_FAULT_CATEGORIES = frozenset({"ib_port", "mlx5", "carrier", "nic_link"})

GPU_FAULT = FindingKind(
    "gpu_fault", "a GPU (or its NVLink/PCIe link) fell off the bus, hit a fatal Xid or is unusable for the job",
    Role.FAULT, "Drain the node and reset or replace the GPU before restarting the job.")
HOST_FAULT = FindingKind(
    "host_fault", "a fault of the host itself: hung tasks (storage), lockups, host memory errors, the OOM killer, "
    "CPU thermal throttling, filesystem errors, the node shutting down, rebooting or panicking", Role.FAULT,
    "Fix the host (storage, memory, cooling, the process's memory use) before restarting the job there.")
PLATFORM_ERROR = FindingKind(
    "platform_error", "a firmware-first (GHES) or machine-check error logged among the GPU's faults",
    Role.FAULT, "Read the BMC event log and inspect the platform (DIMMs, PCIe) of that host.")
NIC_FAULT = FindingKind(
    "nic_fault", "a NIC port flapped, fell back to a lower speed, lost its carrier or logs mlx5 errors",
    Role.FAULT, "Inspect the NIC, its cable and transceiver, and the switch port.")


def fault_kind(category: str, root_xid: object, other: FindingKind) -> FindingKind:
    """The kind of a hardware episode by its category (and root Xid for category ``xid``); ``other`` when it
    is none of the faults (a correctable or application-level event)."""
    if category in GPU_FAULT_CATEGORIES or (category == "xid" and isinstance(root_xid, int)
                                             and root_xid in GPU_FAULT_XIDS):
        return GPU_FAULT
    if category in HOST_FAULT_CATEGORIES:
        return HOST_FAULT
    if category in PLATFORM_ERROR_CATEGORIES:
        return PLATFORM_ERROR
    if category in NIC_FAULT_CATEGORIES:
        return NIC_FAULT
    return other
