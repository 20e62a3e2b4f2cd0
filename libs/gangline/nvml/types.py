"""What the reader reports about a node's GPUs: frozen value objects, no NVML types leak out."""

from __future__ import annotations

from enum import StrEnum
from typing import NewType

from pydantic import BaseModel, ConfigDict

GpuUuid = NewType("GpuUuid", str)
"""``GPU-xxxxxxxx-...`` for a whole GPU, ``MIG-xxxxxxxx-...`` for a MIG device."""
PciBusId = NewType("PciBusId", str)
"""Canonical ``DDDDDDDD:BB:DD.F`` upper-case, as NVML prints it."""
MiB = NewType("MiB", int)
Xid = NewType("Xid", int)
NvlinkDomainId = NewType("NvlinkDomainId", str)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuState(StrEnum):
    OK = "ok"
    LOST = "lost"
    """NVML answered GPU_IS_LOST (fallen off the bus, XID 79) or the handle vanished."""
    RESET_REQUIRED = "reset_required"


class TopologyLevel(StrEnum):
    """``nvmlDeviceGetTopologyCommonAncestor``: the closest common PCIe ancestor of two GPUs."""

    INTERNAL = "internal"
    SINGLE = "single_switch"
    MULTIPLE = "multiple_switches"
    HOSTBRIDGE = "host_bridge"
    NUMA_NODE = "numa_node"
    SYSTEM = "system"


class NvlinkRemoteKind(StrEnum):
    GPU = "gpu"
    SWITCH = "nvswitch"
    OTHER = "other"


class NvlinkLink(_Frozen):
    link: int
    active: bool
    remote_pci_bus_id: PciBusId | None
    remote_kind: NvlinkRemoteKind | None


class MigDevice(_Frozen):
    uuid: GpuUuid
    name: str
    profile: str | None
    """``1g.10gb`` etc., parsed from the MIG device name."""
    memory_mib: MiB | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    placement_start: int | None = None
    """The first memory slice of its GPU instance (``nvmlGpuInstanceGetInfo``); None when unreadable."""


class EccCounts(_Frozen):
    corrected_volatile: int
    uncorrected_volatile: int
    corrected_aggregate: int
    uncorrected_aggregate: int


class RemappedRows(_Frozen):
    correctable: int
    uncorrectable: int
    pending: bool
    failure_occurred: bool


class RetiredPages(_Frozen):
    single_bit_ecc: int
    double_bit_ecc: int
    pending: bool


class GpuHealthSample(_Frozen):
    """The counters that change over time; read on every poll. ``None``: the GPU does not support it."""

    uuid: GpuUuid
    index: int
    state: GpuState
    temperature_c: int | None = None
    throttle_reasons: int | None = None
    """Bitmask of ``nvmlClocksThrottleReason*``."""
    ecc: EccCounts | None = None
    remapped_rows: RemappedRows | None = None
    retired_pages: RetiredPages | None = None


class GpuInfo(_Frozen):
    index: int
    uuid: GpuUuid
    name: str | None
    memory_mib: MiB | None
    pci_bus_id: PciBusId | None
    state: GpuState
    mig_enabled: bool | None
    """``None``: MIG not supported on this GPU."""
    mig_devices: tuple[MigDevice, ...] = ()
    nvlinks: tuple[NvlinkLink, ...] = ()
    health: GpuHealthSample


class NvlinkDomain(_Frozen):
    """GPUs joined by active NVLinks, directly or through the same NVSwitches."""

    id: NvlinkDomainId
    gpus: tuple[GpuUuid, ...]


class TopologyPair(_Frozen):
    a: GpuUuid
    b: GpuUuid
    level: TopologyLevel


class ReadIssue(_Frozen):
    """An NVML call that failed without making the whole read fail."""

    call: str
    error: str
    """The NVMLError subclass name, e.g. ``NVMLError_Timeout``."""
    gpu_index: int | None = None


class NodeInventory(_Frozen):
    node: str
    nvml_available: bool
    driver_version: str | None
    gpus: tuple[GpuInfo, ...]
    nvlink_domains: tuple[NvlinkDomain, ...]
    topology: tuple[TopologyPair, ...]
    issues: tuple[ReadIssue, ...]

    def gpu(self, uuid: GpuUuid) -> GpuInfo:
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        raise KeyError(uuid)


class GpuEventKind(StrEnum):
    XID = "xid"
    DOUBLE_BIT_ECC = "double_bit_ecc"
    SINGLE_BIT_ECC = "single_bit_ecc"
    OTHER = "other"


class GpuEvent(_Frozen):
    """One event from ``nvmlEventSetWait``; ``xid`` is set for XID critical errors."""

    uuid: GpuUuid | None
    """``None`` when the event's device handle could not be mapped back (it vanished)."""
    kind: GpuEventKind
    event_type: int
    xid: Xid | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
