"""Reads a node's GPUs through NVML's call surface and never lets an NVML error escape.

Give it the real ``pynvml`` module on a GPU node, or an ``NvmlStandIn`` anywhere else::

    reader = NvmlReader(pynvml, node="gpu-017")
    inv = reader.inventory()            # NodeInventory: GPUs, MIG, NVLink domains, topology, issues
    samples = reader.sample()           # GpuHealthSample per GPU, cheap enough to poll
    watcher = reader.event_watcher()    # XID / ECC events; blocking, run it in a thread

Error policy, per call: NOT_SUPPORTED / FUNCTION_NOT_FOUND mean "this GPU has no such feature" and
leave the field ``None``; TIMEOUT is retried, then recorded as a :class:`ReadIssue`; GPU_IS_LOST,
GPU_NOT_FOUND and RESET_REQUIRED stop reading that GPU and mark its state; anything else is recorded
and the read goes on. ``nvmlInit`` failing (no driver) yields an inventory with ``nvml_available=False``.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pynvml

from gangline.nvml.types import (
    EccCounts,
    GpuEvent,
    GpuEventKind,
    GpuHealthSample,
    GpuInfo,
    GpuState,
    GpuUuid,
    MiB,
    MigDevice,
    NodeInventory,
    NvlinkDomain,
    NvlinkDomainId,
    NvlinkLink,
    NvlinkRemoteKind,
    PciBusId,
    ReadIssue,
    RemappedRows,
    RetiredPages,
    TopologyLevel,
    TopologyPair,
    Xid,
)


class NvmlApi(Protocol):
    """The slice of pynvml the reader uses. ``pynvml`` itself and ``NvmlStandIn`` both provide it."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any, /) -> str: ...
    def nvmlDeviceGetName(self, handle: Any, /) -> str: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetPciInfo(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetMigMode(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int, /) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpu_instance_id: int, /) -> Any: ...
    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any, /) -> Any: ...
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int, /) -> int: ...
    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int, /) -> Any: ...
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int, /) -> int: ...
    def nvmlDeviceGetTopologyCommonAncestor(self, a: Any, b: Any, /) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int, /) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int, /) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetRetiredPages(self, handle: Any, source: int, /) -> Any: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any, /) -> int: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any, /) -> int: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any, /) -> None: ...
    def nvmlEventSetWait_v2(self, event_set: Any, timeoutms: int, /) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any, /) -> None: ...


WATCHED_EVENTS = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)
_NOT_MIG = 0xFFFFFFFF
_ABSENT = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)
_GONE = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_GpuNotFound)
_MIG_PROFILE = re.compile(r"MIG\s+((?:\d+c\.)?\d+g\.\d+gb(?:\+\w+)?)")
_TOPOLOGY = {
    pynvml.NVML_TOPOLOGY_INTERNAL: TopologyLevel.INTERNAL,
    pynvml.NVML_TOPOLOGY_SINGLE: TopologyLevel.SINGLE,
    pynvml.NVML_TOPOLOGY_MULTIPLE: TopologyLevel.MULTIPLE,
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: TopologyLevel.HOSTBRIDGE,
    pynvml.NVML_TOPOLOGY_NODE: TopologyLevel.NUMA_NODE,
    pynvml.NVML_TOPOLOGY_SYSTEM: TopologyLevel.SYSTEM,
}
_BUS_ID = re.compile(r"^(?:([0-9A-Fa-f]{4,8}):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$")


class _GpuUnreadable(Exception):
    """Internal: this GPU answered LOST / NOT_FOUND / RESET_REQUIRED; stop reading it."""

    def __init__(self, state: GpuState) -> None:
        super().__init__(state)
        self.state = state


@dataclass
class _Ctx:
    issues: list[ReadIssue] = field(default_factory=list)

    def record(self, call: str, err: BaseException, gpu: int | None) -> None:
        self.issues.append(ReadIssue(call=call, error=type(err).__name__, gpu_index=gpu))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def normalise_bus_id(value: Any) -> PciBusId | None:
    """NVML's bus id (bytes or str, 4- or 8-digit domain) in canonical ``DDDDDDDD:BB:DD.F`` form."""
    m = _BUS_ID.match(_text(value).strip())
    if not m:
        return None
    domain, bus, dev, fn = m.groups()
    return PciBusId(f"{int(domain or '0', 16):08X}:{bus.upper()}:{dev.upper()}.{fn}")


def handle_key(handle: Any) -> object:
    """A hashable identity for a device handle: the pointer value for pynvml, the object otherwise."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle


class NvmlReader:
    """Inventory and health counters of one node; safe to call repeatedly, never raises NVMLError."""

    def __init__(self, api: NvmlApi, *, node: str, timeout_retries: int = 1) -> None:
        self._api = api
        self._node = node
        self._retries = timeout_retries
        self._open = False
        self._known: dict[int, GpuUuid] = {}
        """index -> uuid from earlier reads, to name a GPU that no longer answers."""
        self._handles: dict[GpuUuid, Any] = {}
        self._last_index: dict[GpuUuid, int] = {}

    # ---- lifecycle --------------------------------------------------------------------------

    def open(self) -> ReadIssue | None:
        """``nvmlInit``; returns the failure as a value (driver not loaded, library not found...)."""
        if self._open:
            return None
        try:
            self._api.nvmlInit()
        except pynvml.NVMLError as err:
            return ReadIssue(call="nvmlInit", error=type(err).__name__)
        self._open = True
        return None

    def close(self) -> None:
        if self._open:
            self._open = False
            with contextlib.suppress(pynvml.NVMLError):  # shutting down: nothing left to protect
                self._api.nvmlShutdown()

    # ---- reads ------------------------------------------------------------------------------

    def inventory(self) -> NodeInventory:
        ctx = _Ctx()
        init_issue = self.open()
        if init_issue is not None:
            return NodeInventory(
                node=self._node,
                nvml_available=False,
                driver_version=None,
                gpus=(),
                nvlink_domains=(),
                topology=(),
                issues=(init_issue,),
            )
        driver = self._call(ctx, None, "nvmlSystemGetDriverVersion")
        gpus: list[GpuInfo] = []
        handles: dict[GpuUuid, Any] = {}
        for index, handle in self._enumerate(ctx):
            info = self._read_gpu(ctx, index, handle)
            gpus.append(info)
            if info.state is GpuState.OK:
                handles[info.uuid] = handle
        gpus.extend(self._lost_gpu(i, GpuState.LOST, u) for i, u in self._vanished({g.uuid for g in gpus}))
        self._remember((g.index, g.uuid) for g in gpus if g.state is GpuState.OK)
        self._handles = handles
        topology = self._topology(ctx, [g for g in gpus if g.uuid in handles])
        return NodeInventory(
            node=self._node,
            nvml_available=True,
            driver_version=None if driver is None else _text(driver),
            gpus=tuple(gpus),
            nvlink_domains=nvlink_domains(self._node, gpus),
            topology=tuple(topology),
            issues=tuple(ctx.issues),
        )

    def sample(self) -> tuple[tuple[GpuHealthSample, ...], tuple[ReadIssue, ...]]:
        """Health counters of every GPU, for polling between inventories."""
        ctx = _Ctx()
        init_issue = self.open()
        if init_issue is not None:
            return (), (init_issue,)
        out: list[GpuHealthSample] = []
        for index, handle in self._enumerate(ctx):
            if handle is None:
                out.append(self._lost_sample(index, GpuState.LOST))
                continue
            try:
                uuid = GpuUuid(_text(self._must(ctx, index, "nvmlDeviceGetUUID", handle)))
                out.append(self._health(ctx, index, uuid, handle))
            except _GpuUnreadable as gone:
                out.append(self._lost_sample(index, gone.state))
        out.extend(self._lost_sample(i, GpuState.LOST, u) for i, u in self._vanished({s.uuid for s in out}))
        self._remember((s.index, s.uuid) for s in out if s.state is GpuState.OK)
        return tuple(out), tuple(ctx.issues)

    def event_watcher(self, event_types: int = WATCHED_EVENTS) -> NvmlEventWatcher:
        """A watcher over the GPUs that answered the last :meth:`inventory`."""
        return NvmlEventWatcher(self._api, dict(self._handles), event_types, self._retries)

    # ---- per GPU ----------------------------------------------------------------------------

    def _enumerate(self, ctx: _Ctx) -> Iterable[tuple[int, Any]]:
        count = self._call(ctx, None, "nvmlDeviceGetCount")
        for index in range(count or 0):
            try:
                yield index, self._must(ctx, index, "nvmlDeviceGetHandleByIndex", index)
            except _GpuUnreadable:
                yield index, None
            except _Skip:
                continue

    def _vanished(self, seen: set[GpuUuid]) -> list[tuple[int, GpuUuid]]:
        """GPUs an earlier read saw that are no longer enumerated: they left the bus."""
        return sorted((i, u) for u, i in self._last_index.items() if u not in seen)

    def _remember(self, uuids_by_index: Iterable[tuple[int, GpuUuid]]) -> None:
        pairs = list(uuids_by_index)
        self._known = dict(pairs)
        self._last_index.update({u: i for i, u in pairs})

    def _read_gpu(self, ctx: _Ctx, index: int, handle: Any) -> GpuInfo:
        if handle is None:
            return self._lost_gpu(index, GpuState.LOST)
        try:
            uuid = GpuUuid(_text(self._must(ctx, index, "nvmlDeviceGetUUID", handle)))
            name = self._call(ctx, index, "nvmlDeviceGetName", handle)
            mem = self._call(ctx, index, "nvmlDeviceGetMemoryInfo", handle)
            pci = self._call(ctx, index, "nvmlDeviceGetPciInfo", handle)
            mig_enabled, migs = self._mig(ctx, index, handle)
            return GpuInfo(
                index=index,
                uuid=uuid,
                name=None if name is None else _text(name),
                memory_mib=None if mem is None else MiB(int(mem.total) // (1024 * 1024)),
                pci_bus_id=None if pci is None else normalise_bus_id(pci.busId),
                state=GpuState.OK,
                mig_enabled=mig_enabled,
                mig_devices=migs,
                nvlinks=self._nvlinks(ctx, index, handle),
                health=self._health(ctx, index, uuid, handle),
            )
        except _GpuUnreadable as gone:
            return self._lost_gpu(index, gone.state)

    def _mig(self, ctx: _Ctx, index: int, handle: Any) -> tuple[bool | None, tuple[MigDevice, ...]]:
        mode = self._call(ctx, index, "nvmlDeviceGetMigMode", handle)
        if mode is None:
            return None, ()
        if int(mode[0]) != pynvml.NVML_DEVICE_MIG_ENABLE:
            return False, ()
        devices: list[MigDevice] = []
        starts: dict[int, int | None] = {}
        for slot in range(self._call(ctx, index, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
            mig = self._call(
                ctx,
                index,
                "nvmlDeviceGetMigDeviceHandleByIndex",
                handle,
                slot,
                absent=pynvml.NVMLError_NotFound,
            )
            if mig is None:
                continue
            uuid = self._call(ctx, index, "nvmlDeviceGetUUID", mig)
            if uuid is None:
                continue
            name = _text(self._call(ctx, index, "nvmlDeviceGetName", mig) or "")
            mem = self._call(ctx, index, "nvmlDeviceGetMemoryInfo", mig)
            profile = _MIG_PROFILE.search(name)
            gi = self._call(ctx, index, "nvmlDeviceGetGpuInstanceId", mig)
            if gi is not None and int(gi) not in starts:
                starts[int(gi)] = self._placement_start(ctx, index, handle, int(gi))
            devices.append(
                MigDevice(
                    uuid=GpuUuid(_text(uuid)),
                    name=name,
                    profile=profile.group(1) if profile else None,
                    memory_mib=None if mem is None else MiB(int(mem.total) // (1024 * 1024)),
                    gpu_instance_id=gi,
                    compute_instance_id=self._call(ctx, index, "nvmlDeviceGetComputeInstanceId", mig),
                    placement_start=None if gi is None else starts[int(gi)],
                )
            )
        return True, tuple(devices)

    def _placement_start(self, ctx: _Ctx, index: int, handle: Any, gpu_instance_id: int) -> int | None:
        """Where GPU instance ``gpu_instance_id`` sits: its first memory slice (its id says nothing of it)."""
        instance = self._call(ctx, index, "nvmlDeviceGetGpuInstanceById", handle, gpu_instance_id)
        info = None if instance is None else self._call(ctx, index, "nvmlGpuInstanceGetInfo", instance)
        return None if info is None else int(info.placement.start)

    def _nvlinks(self, ctx: _Ctx, index: int, handle: Any) -> tuple[NvlinkLink, ...]:
        links: list[NvlinkLink] = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            state = self._call(
                ctx, index, "nvmlDeviceGetNvLinkState", handle, link, absent=pynvml.NVMLError_InvalidArgument
            )
            if state is None:
                continue
            active = int(state) == pynvml.NVML_FEATURE_ENABLED
            remote: PciBusId | None = None
            kind: NvlinkRemoteKind | None = None
            if active:
                pci = self._call(ctx, index, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
                remote = None if pci is None else normalise_bus_id(pci.busId)
                raw_kind = self._call(ctx, index, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
                if raw_kind is not None:
                    kind = {
                        pynvml.NVML_NVLINK_DEVICE_TYPE_GPU: NvlinkRemoteKind.GPU,
                        pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH: NvlinkRemoteKind.SWITCH,
                    }.get(int(raw_kind), NvlinkRemoteKind.OTHER)
            links.append(NvlinkLink(link=link, active=active, remote_pci_bus_id=remote, remote_kind=kind))
        return tuple(links)

    def _health(self, ctx: _Ctx, index: int, uuid: GpuUuid, handle: Any) -> GpuHealthSample:
        temp = self._call(ctx, index, "nvmlDeviceGetTemperature", handle, pynvml.NVML_TEMPERATURE_GPU)
        throttle = self._call(ctx, index, "nvmlDeviceGetCurrentClocksEventReasons", handle)
        if throttle is None:  # drivers before the rename only have the old name
            throttle = self._call(ctx, index, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return GpuHealthSample(
            uuid=uuid,
            index=index,
            state=GpuState.OK,
            temperature_c=temp,
            throttle_reasons=throttle,
            ecc=self._ecc(ctx, index, handle),
            remapped_rows=self._remapped(ctx, index, handle),
            retired_pages=self._retired(ctx, index, handle),
        )

    def _ecc(self, ctx: _Ctx, index: int, handle: Any) -> EccCounts | None:
        values: list[int] = []
        for err in (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
            for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
                v = self._call(ctx, index, "nvmlDeviceGetTotalEccErrors", handle, err, counter)
                if v is None:
                    return None
                values.append(int(v))
        cv, ca, uv, ua = values
        return EccCounts(
            corrected_volatile=cv, corrected_aggregate=ca, uncorrected_volatile=uv, uncorrected_aggregate=ua
        )

    def _remapped(self, ctx: _Ctx, index: int, handle: Any) -> RemappedRows | None:
        rows = self._call(ctx, index, "nvmlDeviceGetRemappedRows", handle)
        if rows is None:
            return None
        corr, unc, pending, failure = rows
        return RemappedRows(
            correctable=int(corr),
            uncorrectable=int(unc),
            pending=bool(pending),
            failure_occurred=bool(failure),
        )

    def _retired(self, ctx: _Ctx, index: int, handle: Any) -> RetiredPages | None:
        sbe = self._call(
            ctx,
            index,
            "nvmlDeviceGetRetiredPages",
            handle,
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        if sbe is None:
            return None
        dbe = self._call(
            ctx,
            index,
            "nvmlDeviceGetRetiredPages",
            handle,
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        pending = self._call(ctx, index, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
        return RetiredPages(single_bit_ecc=len(sbe), double_bit_ecc=len(dbe or ()), pending=bool(pending))

    def _topology(self, ctx: _Ctx, gpus: Sequence[GpuInfo]) -> list[TopologyPair]:
        pairs: list[TopologyPair] = []
        for i, a in enumerate(gpus):
            for b in gpus[i + 1 :]:
                try:
                    level = self._call(
                        ctx,
                        a.index,
                        "nvmlDeviceGetTopologyCommonAncestor",
                        self._handles[a.uuid],
                        self._handles[b.uuid],
                    )
                except _GpuUnreadable:
                    continue
                if level is not None and int(level) in _TOPOLOGY:
                    pairs.append(TopologyPair(a=a.uuid, b=b.uuid, level=_TOPOLOGY[int(level)]))
        return pairs

    def _lost_gpu(self, index: int, state: GpuState, uuid: GpuUuid | None = None) -> GpuInfo:
        uuid = uuid or self._known.get(index, GpuUuid(f"GPU-unknown-index-{index}"))
        return GpuInfo(
            index=index,
            uuid=uuid,
            name=None,
            memory_mib=None,
            pci_bus_id=None,
            state=state,
            mig_enabled=None,
            health=GpuHealthSample(uuid=uuid, index=index, state=state),
        )

    def _lost_sample(self, index: int, state: GpuState, uuid: GpuUuid | None = None) -> GpuHealthSample:
        uuid = uuid or self._known.get(index, GpuUuid(f"GPU-unknown-index-{index}"))
        return GpuHealthSample(uuid=uuid, index=index, state=state)

    # ---- the one place NVML errors are handled -------------------------------------------------

    def _call(
        self,
        ctx: _Ctx,
        gpu: int | None,
        call: str,
        *args: Any,
        absent: type[BaseException] | tuple[type[BaseException], ...] = (),
    ) -> Any:
        """The call's value, or ``None`` when unsupported or failed (recorded); raises _GpuUnreadable."""
        try:
            return self._must(ctx, gpu, call, *args, absent=absent)
        except _Skip:
            return None

    def _must(
        self,
        ctx: _Ctx,
        gpu: int | None,
        call: str,
        *args: Any,
        absent: type[BaseException] | tuple[type[BaseException], ...] = (),
    ) -> Any:
        fn: Callable[..., Any] = getattr(self._api, call)
        absent_errors = (*_ABSENT, *(absent if isinstance(absent, tuple) else (absent,)))
        for attempt in range(self._retries + 1):
            try:
                return fn(*args)
            except pynvml.NVMLError_Timeout as err:
                if attempt < self._retries:
                    continue
                ctx.record(call, err, gpu)
                raise _Skip from err
            except absent_errors as err:
                raise _Skip from err
            except _GONE as err:
                ctx.record(call, err, gpu)
                raise _GpuUnreadable(GpuState.LOST) from err
            except pynvml.NVMLError_ResetRequired as err:
                ctx.record(call, err, gpu)
                raise _GpuUnreadable(GpuState.RESET_REQUIRED) from err
            except pynvml.NVMLError as err:
                ctx.record(call, err, gpu)
                raise _Skip from err
        raise AssertionError("unreachable")  # pragma: no cover


class _Skip(Exception):
    """Internal: this call has no usable value."""


def nvlink_domains(node: str, gpus: Sequence[GpuInfo]) -> tuple[NvlinkDomain, ...]:
    """Group GPUs joined by active NVLinks (directly, or through the same NVSwitch) into domains.

    A GPU without active links is a domain of one. Ids are ``<node>/nvl<n>`` numbered by the lowest
    GPU index in each domain, so they are stable across reads of the same node.
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    live = [g for g in gpus if g.state is GpuState.OK]
    by_bus = {g.pci_bus_id: g.uuid for g in live if g.pci_bus_id}
    for g in live:
        find(g.uuid)
        for link in g.nvlinks:
            if not link.active or link.remote_pci_bus_id is None:
                continue
            peer = by_bus.get(link.remote_pci_bus_id)
            if peer is not None and link.remote_kind in (None, NvlinkRemoteKind.GPU):
                union(g.uuid, peer)
            elif link.remote_kind is not NvlinkRemoteKind.GPU:
                union(g.uuid, f"switch:{link.remote_pci_bus_id}")
    groups: dict[str, list[GpuInfo]] = {}
    for g in live:
        groups.setdefault(find(g.uuid), []).append(g)
    ordered = sorted(groups.values(), key=lambda members: min(m.index for m in members))
    return tuple(
        NvlinkDomain(
            id=NvlinkDomainId(f"{node}/nvl{n}"),
            gpus=tuple(m.uuid for m in sorted(members, key=lambda m: m.index)),
        )
        for n, members in enumerate(ordered)
    )


@dataclass(frozen=True)
class WatchResult:
    events: tuple[GpuEvent, ...]
    issues: tuple[ReadIssue, ...]


class NvmlEventWatcher:
    """XID and ECC events through an NVML event set.

    :meth:`poll` blocks up to ``timeout_ms`` in ``nvmlEventSetWait_v2``; an agent runs it with
    ``asyncio.to_thread``. GPUs that cannot deliver some event type are registered for the rest.
    """

    def __init__(self, api: NvmlApi, handles: dict[GpuUuid, Any], event_types: int, retries: int) -> None:
        self._api = api
        self._handles = handles
        self._by_key = {handle_key(h): uuid for uuid, h in handles.items()}
        self._types = event_types
        self._set: Any = None
        self._registered: dict[GpuUuid, int] = {}
        self._retries = retries

    @property
    def registered(self) -> dict[GpuUuid, int]:
        return dict(self._registered)

    def start(self) -> tuple[ReadIssue, ...]:
        issues: list[ReadIssue] = []
        try:
            self._set = self._api.nvmlEventSetCreate()
        except pynvml.NVMLError as err:
            return (ReadIssue(call="nvmlEventSetCreate", error=type(err).__name__),)
        for uuid, handle in self._handles.items():
            try:
                mask = self._types & int(self._api.nvmlDeviceGetSupportedEventTypes(handle))
                if mask:
                    self._api.nvmlDeviceRegisterEvents(handle, mask, self._set)
                    self._registered[uuid] = mask
            except pynvml.NVMLError as err:
                issues.append(
                    ReadIssue(call="nvmlDeviceRegisterEvents", error=f"{type(err).__name__} {uuid}")
                )
        return tuple(issues)

    def poll(self, timeout_ms: int, *, max_events: int = 256) -> WatchResult:
        """Wait up to ``timeout_ms`` for the first event, then drain what is already queued."""
        if self._set is None:
            return WatchResult((), (ReadIssue(call="nvmlEventSetWait_v2", error="not started"),))
        events: list[GpuEvent] = []
        issues: list[ReadIssue] = []
        wait = timeout_ms
        while len(events) < max_events:
            try:
                data = self._api.nvmlEventSetWait_v2(self._set, wait)
            except pynvml.NVMLError_Timeout:
                break
            except pynvml.NVMLError as err:
                # GPU_IS_LOST here means a registered GPU fell off the bus; the caller re-reads.
                issues.append(ReadIssue(call="nvmlEventSetWait_v2", error=type(err).__name__))
                break
            events.append(self._decode(data))
            wait = 0
        return WatchResult(tuple(events), tuple(issues))

    def close(self) -> None:
        if self._set is not None:
            with contextlib.suppress(pynvml.NVMLError):  # the set dies with the process anyway
                self._api.nvmlEventSetFree(self._set)
            self._set = None

    def _decode(self, data: Any) -> GpuEvent:
        etype = int(data.eventType)
        if etype & pynvml.nvmlEventTypeXidCriticalError:
            kind, xid = GpuEventKind.XID, Xid(int(data.eventData))
        elif etype & pynvml.nvmlEventTypeDoubleBitEccError:
            kind, xid = GpuEventKind.DOUBLE_BIT_ECC, None
        elif etype & pynvml.nvmlEventTypeSingleBitEccError:
            kind, xid = GpuEventKind.SINGLE_BIT_ECC, None
        else:
            kind, xid = GpuEventKind.OTHER, None
        gi = int(getattr(data, "gpuInstanceId", _NOT_MIG))
        ci = int(getattr(data, "computeInstanceId", _NOT_MIG))
        uuid = self._by_key.get(handle_key(data.device))
        return GpuEvent(
            uuid=uuid,
            kind=kind,
            event_type=etype,
            xid=xid,
            gpu_instance_id=None if gi == _NOT_MIG else gi,
            compute_instance_id=None if ci == _NOT_MIG else ci,
        )
