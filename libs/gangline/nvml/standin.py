"""A data-driven NVML stand-in with pynvml's call surface and its real error classes.

Methods are named exactly like the ``pynvml`` functions the reader calls and raise the same
``pynvml.NVMLError_*`` subclasses in the same situations (not supported, not found, GPU lost,
timeout, uninitialised), so the reader cannot tell the two apart. Failure injection mutates the
simulated node and queues the events real NVML would deliver. No real time passes:
``nvmlEventSetWait_v2`` raises ``NVMLError_Timeout`` at once when nothing is queued.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

import pynvml

from gangline.nvml.spec import GpuSpec, NodeSpec

_NOT_MIG = 0xFFFFFFFF
_MIB = 1024 * 1024
_BUS_ID = re.compile(r"^(?:([0-9A-Fa-f]{4,8}):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$")

_GPU_INSTANCE_PROFILE_BY_COMPUTE = {
    1: pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    7: pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
}
"""``profileId`` here is the profile constant of the instance's compute slices (``3g`` -> 3_SLICE)."""

_EVENT_BITS = {
    "xid": pynvml.nvmlEventTypeXidCriticalError,
    "double_bit_ecc": pynvml.nvmlEventTypeDoubleBitEccError,
    "single_bit_ecc": pynvml.nvmlEventTypeSingleBitEccError,
}


def canonical_bus_id(bus_id: str) -> str:
    """``0000:18:00.0`` -> ``00000000:18:00.0`` as NVML writes it."""
    m = _BUS_ID.match(bus_id.strip())
    if not m:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):08X}:{bus.upper()}:{dev.upper()}.{fn}"


@dataclass(frozen=True, eq=False)
class StandInHandle:
    """Opaque device handle; identity matters, as with NVML's pointers."""

    gpu: int
    mig: int | None = None


@dataclass(frozen=True, eq=False)
class StandInGpuInstance:
    """Opaque GPU-instance handle (``nvmlDeviceGetGpuInstanceById``)."""

    gpu: int
    gpu_instance_id: int


@dataclass(frozen=True)
class GpuInstancePlacement:
    start: int
    size: int


@dataclass(frozen=True)
class GpuInstanceInfo:
    """``nvmlGpuInstanceInfo_t``: the parent device, the instance id and where it sits."""

    device: StandInHandle
    id: int
    profileId: int
    placement: GpuInstancePlacement


@dataclass(frozen=True)
class PciInfo:
    busId: bytes
    busIdLegacy: bytes
    domain: int
    bus: int
    device: int


@dataclass(frozen=True)
class MemoryInfo:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class EventData:
    device: StandInHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = _NOT_MIG
    computeInstanceId: int = _NOT_MIG


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)
    """gpu index -> event type mask."""
    queue: deque[EventData] = field(default_factory=deque)
    freed: bool = False


@dataclass
class _GpuState:
    spec: GpuSpec
    handle: StandInHandle
    mig_handles: tuple[StandInHandle, ...]
    lost: bool = False
    present: bool = True
    temperature_c: int = 35
    throttle_reasons: int = 0
    ecc_corrected_volatile: int = 0
    ecc_uncorrected_volatile: int = 0
    ecc_corrected_aggregate: int = 0
    ecc_uncorrected_aggregate: int = 0
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    retired_sbe: list[int] = field(default_factory=list)
    retired_dbe: list[int] = field(default_factory=list)
    retired_pending: bool = False


@dataclass
class _InjectedError:
    call: str
    error: type[pynvml.NVMLError]
    gpu: int | None
    remaining: int


class NvmlStandIn:
    """One simulated node. Construct from a :class:`NodeSpec`; hand it to the reader instead of ``pynvml``."""

    NVMLError = pynvml.NVMLError

    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self._init_count = 0
        self._gpus: list[_GpuState] = []
        for i, g in enumerate(spec.gpus):
            handle = StandInHandle(i)
            migs = tuple(StandInHandle(i, m) for m in range(len(g.mig_devices)))
            self._gpus.append(
                _GpuState(
                    spec=g,
                    handle=handle,
                    mig_handles=migs,
                    temperature_c=g.temperature_c,
                    throttle_reasons=g.throttle_reasons,
                )
            )
        self._event_sets: list[_EventSet] = []
        self._injected: list[_InjectedError] = []
        self._next_page = 0x1000

    # ---- failure injection ------------------------------------------------------------------

    def fall_off_bus(self, gpu: int) -> None:
        """XID 79: the GPU stops answering; every call on it raises ``NVMLError_GpuIsLost``."""
        self._emit_xid(gpu, 79)
        self._gpus[gpu].lost = True

    def disappear(self, gpu: int) -> None:
        """The GPU is gone from enumeration: the count drops, indices shift, old handles are lost."""
        self._gpus[gpu].present = False
        self._gpus[gpu].lost = True

    def double_bit_ecc(self, gpu: int) -> None:
        """XID 48: an uncorrectable ECC error, with the remap or page retirement the GPU would start."""
        s = self._gpus[gpu]
        s.ecc_uncorrected_volatile += 1
        s.ecc_uncorrected_aggregate += 1
        if s.spec.row_remapping:
            s.remap_uncorrectable += 1
            s.remap_pending = True
        elif s.spec.page_retirement:
            s.retired_dbe.append(self._page())
            s.retired_pending = True
        self._queue(gpu, pynvml.nvmlEventTypeDoubleBitEccError, 0)
        self._emit_xid(gpu, 48)

    def row_remap_pending(self, gpu: int) -> None:
        """XID 63 on Ampere+: a row was marked for remapping; a GPU reset activates it."""
        s = self._gpus[gpu]
        s.remap_uncorrectable += 1
        s.remap_pending = True
        self._emit_xid(gpu, 63)

    def row_remap_failure(self, gpu: int) -> None:
        """XID 64 on Ampere+: the bank had no spare row left; the memory is failing."""
        self._gpus[gpu].remap_failure = True
        self._emit_xid(gpu, 64)

    def app_fault(self, gpu: int, xid: int = 13) -> None:
        """An application-level XID (13 graphics exception, 31 MMU fault, 43 stopped processing)."""
        if xid not in (13, 31, 43, 45):
            raise ValueError(f"XID {xid} is not an application fault")
        self._emit_xid(gpu, xid)

    def xid(self, gpu: int, code: int) -> None:
        self._emit_xid(gpu, code)

    def correctable_ecc(self, gpu: int, count: int = 1, *, announced: bool = True) -> None:
        """``announced=False``: only the counters move, no event is delivered (as many drivers do)."""
        s = self._gpus[gpu]
        s.ecc_corrected_volatile += count
        s.ecc_corrected_aggregate += count
        for _ in range(count if announced else 0):
            self._queue(gpu, pynvml.nvmlEventTypeSingleBitEccError, 0)

    def set_temperature(self, gpu: int, celsius: int, throttle_reasons: int | None = None) -> None:
        self._gpus[gpu].temperature_c = celsius
        if throttle_reasons is not None:
            self._gpus[gpu].throttle_reasons = throttle_reasons

    def reset_gpu(self, gpu: int) -> None:
        """What ``nvidia-smi -r`` does: volatile counters clear, pending remaps/retirements activate."""
        s = self._gpus[gpu]
        s.ecc_corrected_volatile = s.ecc_uncorrected_volatile = 0
        s.remap_pending = False
        s.retired_pending = False

    def inject_error(
        self, call: str, error: type[pynvml.NVMLError], *, gpu: int | None = None, times: int = 1
    ) -> None:
        """The next ``times`` calls of ``call`` (on ``gpu``, or any) raise ``error``."""
        if not callable(getattr(self, call, None)):
            raise ValueError(f"the stand-in has no NVML call {call!r}")
        self._injected.append(_InjectedError(call, error, gpu, times))

    # ---- library lifecycle ------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._check("nvmlInit", None, require_init=False)
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown", None)
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion", None)
        return self.spec.driver_version

    # ---- enumeration ------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount", None)
        return len(self._present())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> StandInHandle:
        present = self._present()
        if not 0 <= index < len(present):
            self._check("nvmlDeviceGetHandleByIndex", None)
            raise pynvml.NVMLError_InvalidArgument()
        s = present[index]
        self._check("nvmlDeviceGetHandleByIndex", s.handle)
        if s.lost:
            raise pynvml.NVMLError_GpuIsLost()
        return s.handle

    def nvmlDeviceGetIndex(self, handle: StandInHandle) -> int:
        s = self._gpu(handle, "nvmlDeviceGetIndex", mig_ok=False)
        return self._present().index(s)

    def nvmlDeviceGetUUID(self, handle: StandInHandle) -> str:
        self._gpu(handle, "nvmlDeviceGetUUID")
        if handle.mig is not None:
            return self.spec.mig_uuid(handle.gpu, handle.mig)
        return self.spec.gpu_uuid(handle.gpu)

    def nvmlDeviceGetName(self, handle: StandInHandle) -> str:
        s = self._gpu(handle, "nvmlDeviceGetName")
        if handle.mig is not None:
            return f"{s.spec.name} MIG {s.spec.mig_devices[handle.mig].profile}"
        return s.spec.name

    def nvmlDeviceGetMemoryInfo(self, handle: StandInHandle) -> MemoryInfo:
        s = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        mib = s.spec.memory_mib if handle.mig is None else s.spec.mig_devices[handle.mig].memory_mib
        used = 0 if handle.mig is not None else 512 * _MIB
        return MemoryInfo(total=mib * _MIB, free=mib * _MIB - used, used=used)

    def nvmlDeviceGetPciInfo(self, handle: StandInHandle) -> PciInfo:
        s = self._gpu(handle, "nvmlDeviceGetPciInfo")
        return _pci(s.spec.pci_bus_id)

    # ---- MIG --------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: StandInHandle) -> list[int]:
        s = self._gpu(handle, "nvmlDeviceGetMigMode", mig_ok=False)
        if not s.spec.mig_capable:
            raise pynvml.NVMLError_NotSupported()
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if s.spec.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: StandInHandle) -> int:
        s = self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount", mig_ok=False)
        if not s.spec.mig_capable:
            raise pynvml.NVMLError_NotSupported()
        return 7 if s.spec.mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: StandInHandle, index: int) -> StandInHandle:
        s = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex", mig_ok=False)
        if not s.spec.mig_capable:
            raise pynvml.NVMLError_NotSupported()
        if not s.spec.mig_enabled:
            raise pynvml.NVMLError_InvalidArgument()
        if not 0 <= index < 7:
            raise pynvml.NVMLError_InvalidArgument()
        if index >= len(s.mig_handles):
            raise pynvml.NVMLError_NotFound()
        return s.mig_handles[index]

    def nvmlDeviceGetGpuInstanceId(self, handle: StandInHandle) -> int:
        s = self._gpu(handle, "nvmlDeviceGetGpuInstanceId")
        if handle.mig is None:
            raise pynvml.NVMLError_InvalidArgument()
        return s.spec.mig_devices[handle.mig].gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: StandInHandle) -> int:
        s = self._gpu(handle, "nvmlDeviceGetComputeInstanceId")
        if handle.mig is None:
            raise pynvml.NVMLError_InvalidArgument()
        return s.spec.mig_devices[handle.mig].compute_instance_id

    def nvmlDeviceGetGpuInstanceById(self, handle: StandInHandle, gpu_instance_id: int) -> StandInGpuInstance:
        s = self._gpu(handle, "nvmlDeviceGetGpuInstanceById", mig_ok=False)
        if not s.spec.mig_capable or not s.spec.mig_enabled:
            raise pynvml.NVMLError_NotSupported()
        if not any(m.gpu_instance_id == gpu_instance_id for m in s.spec.mig_devices):
            raise pynvml.NVMLError_NotFound()
        return StandInGpuInstance(handle.gpu, gpu_instance_id)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: StandInGpuInstance) -> GpuInstanceInfo:
        if not isinstance(gpu_instance, StandInGpuInstance):
            self._check("nvmlGpuInstanceGetInfo", None)
            raise pynvml.NVMLError_InvalidArgument()
        s = self._gpu(self._gpus[gpu_instance.gpu].handle, "nvmlGpuInstanceGetInfo", mig_ok=False)
        m = next(m for m in s.spec.mig_devices if m.gpu_instance_id == gpu_instance.gpu_instance_id)
        return GpuInstanceInfo(
            device=s.handle,
            id=m.gpu_instance_id,
            profileId=_GPU_INSTANCE_PROFILE_BY_COMPUTE.get(_compute_slices(m.profile), 0),
            placement=GpuInstancePlacement(start=m.placement_start, size=m.placement_size),
        )

    # ---- NVLink and topology ----------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, handle: StandInHandle, link: int) -> int:
        s = self._gpu(handle, "nvmlDeviceGetNvLinkState", mig_ok=False)
        self._link_remote(s, link)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: StandInHandle, link: int) -> PciInfo:
        s = self._gpu(handle, "nvmlDeviceGetNvLinkRemotePciInfo", mig_ok=False)
        remote, _ = self._link_remote(s, link)
        return _pci(remote)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: StandInHandle, link: int) -> int:
        s = self._gpu(handle, "nvmlDeviceGetNvLinkRemoteDeviceType", mig_ok=False)
        _, kind = self._link_remote(s, link)
        return kind

    def nvmlDeviceGetTopologyCommonAncestor(self, a: StandInHandle, b: StandInHandle) -> int:
        sa = self._gpu(a, "nvmlDeviceGetTopologyCommonAncestor", mig_ok=False)
        sb = self._gpu(b, "nvmlDeviceGetTopologyCommonAncestor", mig_ok=False)
        if sa is sb:
            return int(pynvml.NVML_TOPOLOGY_INTERNAL)
        ga, gb = sa.spec, sb.spec
        if ga.pcie_switch is not None and ga.pcie_switch == gb.pcie_switch:
            return int(pynvml.NVML_TOPOLOGY_SINGLE)
        if ga.pcie_root is not None and ga.pcie_root == gb.pcie_root:
            return int(pynvml.NVML_TOPOLOGY_MULTIPLE)
        if ga.numa_node == gb.numa_node:
            return int(pynvml.NVML_TOPOLOGY_NODE)
        return int(pynvml.NVML_TOPOLOGY_SYSTEM)

    # ---- health counters --------------------------------------------------------------------

    def nvmlDeviceGetTemperature(self, handle: StandInHandle, sensor: int) -> int:
        s = self._gpu(handle, "nvmlDeviceGetTemperature", mig_ok=False)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return s.temperature_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: StandInHandle) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons", mig_ok=False).throttle_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: StandInHandle) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons", mig_ok=False).throttle_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: StandInHandle, error_type: int, counter_type: int) -> int:
        s = self._gpu(handle, "nvmlDeviceGetTotalEccErrors", mig_ok=False)
        if not s.spec.ecc:
            raise pynvml.NVMLError_NotSupported()
        table = {
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): s.ecc_corrected_volatile,
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): s.ecc_uncorrected_volatile,
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): s.ecc_corrected_aggregate,
            (
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_AGGREGATE_ECC,
            ): s.ecc_uncorrected_aggregate,
        }
        if (error_type, counter_type) not in table:
            raise pynvml.NVMLError_InvalidArgument()
        return table[(error_type, counter_type)]

    def nvmlDeviceGetRemappedRows(self, handle: StandInHandle) -> tuple[int, int, int, int]:
        s = self._gpu(handle, "nvmlDeviceGetRemappedRows", mig_ok=False)
        if not s.spec.row_remapping:
            raise pynvml.NVMLError_NotSupported()
        return (s.remap_correctable, s.remap_uncorrectable, int(s.remap_pending), int(s.remap_failure))

    def nvmlDeviceGetRetiredPages(self, handle: StandInHandle, source: int) -> list[int]:
        s = self._gpu(handle, "nvmlDeviceGetRetiredPages", mig_ok=False)
        if not s.spec.page_retirement:
            raise pynvml.NVMLError_NotSupported()
        if source == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
            return list(s.retired_sbe)
        if source == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
            return list(s.retired_dbe)
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: StandInHandle) -> int:
        s = self._gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus", mig_ok=False)
        if not s.spec.page_retirement:
            raise pynvml.NVMLError_NotSupported()
        return int(s.retired_pending)

    # ---- events -----------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        self._check("nvmlEventSetCreate", None)
        es = _EventSet()
        self._event_sets.append(es)
        return es

    def nvmlDeviceGetSupportedEventTypes(self, handle: StandInHandle) -> int:
        s = self._gpu(handle, "nvmlDeviceGetSupportedEventTypes", mig_ok=False)
        mask = 0
        for name in s.spec.supported_events:
            mask |= _EVENT_BITS[name]
        return mask

    def nvmlDeviceRegisterEvents(self, handle: StandInHandle, event_types: int, event_set: _EventSet) -> None:
        s = self._gpu(handle, "nvmlDeviceRegisterEvents", mig_ok=False)
        if event_set.freed:
            raise pynvml.NVMLError_InvalidArgument()
        if event_types & ~self.nvmlDeviceGetSupportedEventTypes(handle):
            raise pynvml.NVMLError_NotSupported()
        event_set.registered[s.handle.gpu] = event_set.registered.get(s.handle.gpu, 0) | event_types

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeoutms: int) -> EventData:
        self._check("nvmlEventSetWait_v2", None)
        if event_set.freed:
            raise pynvml.NVMLError_InvalidArgument()
        if not event_set.queue:
            raise pynvml.NVMLError_Timeout()
        return event_set.queue.popleft()

    def nvmlEventSetWait(self, event_set: _EventSet, timeoutms: int) -> EventData:
        return self.nvmlEventSetWait_v2(event_set, timeoutms)

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._check("nvmlEventSetFree", None)
        event_set.freed = True
        self._event_sets.remove(event_set)

    # ---- internals --------------------------------------------------------------------------

    def _present(self) -> list[_GpuState]:
        return [s for s in self._gpus if s.present]

    def _check(self, call: str, handle: StandInHandle | None, *, require_init: bool = True) -> None:
        for inj in self._injected:
            if inj.call == call and (inj.gpu is None or (handle is not None and handle.gpu == inj.gpu)):
                inj.remaining -= 1
                if inj.remaining <= 0:
                    self._injected.remove(inj)
                raise inj.error()
        if require_init and self._init_count <= 0:
            raise pynvml.NVMLError_Uninitialized()

    def _gpu(self, handle: StandInHandle, call: str, *, mig_ok: bool = True) -> _GpuState:
        self._check(call, handle)
        if not isinstance(handle, StandInHandle) or not 0 <= handle.gpu < len(self._gpus):
            raise pynvml.NVMLError_InvalidArgument()
        s = self._gpus[handle.gpu]
        if s.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if handle.mig is not None and not mig_ok:
            raise pynvml.NVMLError_NotSupported()
        return s

    def _link_remote(self, s: _GpuState, link: int) -> tuple[str, int]:
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise pynvml.NVMLError_InvalidArgument()
        g = s.spec
        if g.nvlink_to == "nvswitch" and link < g.nvlinks:
            switches = self.spec.nvswitches
            return switches[link % len(switches)], pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        if g.nvlink_to == "peers" and link < len(g.nvlink_peers) * g.links_per_peer:
            peer = g.nvlink_peers[link // g.links_per_peer]
            return self.spec.gpus[peer].pci_bus_id, pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        raise pynvml.NVMLError_NotSupported()

    def _emit_xid(self, gpu: int, code: int) -> None:
        self._queue(gpu, pynvml.nvmlEventTypeXidCriticalError, code)

    def _queue(self, gpu: int, event_type: int, data: int) -> None:
        for es in self._event_sets:
            if es.registered.get(gpu, 0) & event_type:
                es.queue.append(EventData(self._gpus[gpu].handle, event_type, data))

    def _page(self) -> int:
        self._next_page += 0x1000
        return self._next_page


def _compute_slices(profile: str) -> int:
    """``3g.40gb`` -> 3 (the GPU instance's compute slices)."""
    m = re.match(r"^(?:[0-9]+c\.)?([0-9]+)g\.", profile)
    return int(m.group(1)) if m else 0


def _pci(bus_id: str) -> PciInfo:
    canon = canonical_bus_id(bus_id)
    domain, bus, rest = canon.split(":")
    return PciInfo(
        busId=canon.encode(),
        busIdLegacy=canon[-12:].encode(),
        domain=int(domain, 16),
        bus=int(bus, 16),
        device=int(rest.split(".")[0], 16),
    )
