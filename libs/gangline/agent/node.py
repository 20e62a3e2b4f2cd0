"""The node agent: one GPU node's voice on Kafka, and the hands that start and stop its ranks.

::

    settings = NodeAgentSettings(node="n0", leaf="leaf-0", spine="spine-0",
                                 checkpoint_root=Path("/var/lib/gangline/ckpt"),
                                 log_dir=Path("/var/log/gangline"))
    async with EventProducer(settings.kafka_bootstrap) as producer:
        agent = NodeAgent(settings, nvml_api=pynvml, runner=ProcessRunner(), producer=producer)
        await agent.start()        # node.registered, then heartbeats, health, and grants
        ...
        await agent.stop()         # ranks stopped cleanly, consumer committed and closed

What it does:

- **Registers** its GPUs (``node.registered`` on nodes.inventory), **heartbeats** every
  ``heartbeat_interval_s`` (``node.heartbeat`` v2 on nodes.heartbeats) and turns NVML findings
  (XID / ECC events from the watcher, counters from ``sample()``, folded by ``GpuHealthMonitor``)
  into ``gpu.health_changed`` on nodes.health whenever a GPU's state (healthy / degraded / failed)
  changes, and reports each countable error as ``gpu.error_reported``: the drain policy is the core's
  (:mod:`gangline.core.health`), the agent judges single events, node_health the repeated ones.
- **Runs grants**: an ``allocation.granted`` with placements on this node launches them through the
  :class:`~gangline.agent.runner.Runner`, with the job's spec (command, env, duration) taken from
  ``job.admitted`` on jobs.events. A grant is handled once per allocation id, however often it is
  delivered. ``allocation.released`` stops the ranks.
- **Reports** on jobs.events: ``worker.exited`` per rank exit (``restarts`` = the gang attempt),
  ``job.started`` / ``job.completed`` / ``job.failed`` from the node hosting rank 0, and
  ``job.checkpointed`` per node when a ``job.preempting`` checkpoint was acknowledged by every rank.
- **Enforces time limits**: a job whose spec has ``time_limit_s`` is stopped when it has run that long
  here (a simulated runner's seconds scaled): the checkpoint signal first (``preempt_signal``), the
  job's ``checkpoint_grace_s`` to write it (at most ``max_grace_s``), then the ranks are killed; it ends
  as ``job.failed`` code ``time_limit`` (from the node hosting rank 0), after ``job.checkpointed``
  when every rank acknowledged.
  The outcome carries the GPU-seconds the gang held (``gpu_seconds``). The agent never writes
  allocations.log: placement reads the outcome and releases the allocation (``allocation.released``
  completed / failed), so the log's releases have the writers DESIGN §3 names.
- **Resizes elastic jobs**: ``job.resizing`` is a checkpoint request like ``job.preempting`` (the ranks
  checkpoint and stop, ``job.checkpointed``); the grant that ``resizes`` the allocation then launches
  the new size (its own ``WORLD_SIZE`` and ranks) from the same checkpoint directory, once the old
  ranks here have stopped.
- **Restarts gangs across nodes**: a peer's ``worker.exited`` with a failure tears this node's ranks of
  the same attempt down (``peer_failed``); every node then applies the same restart policy.

Event ids of job events are derived from the allocation (uuid5), so a re-run reports the same ids.
``handle(envelope)`` is public: a simulated cluster may drive many agents from one consumer
(``consume=False``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from gangline.agent.env import Placement as LayoutPlacement
from gangline.agent.env import checkpoint_dir_for, layout_for_node
from gangline.agent.events import (
    AgentEvent,
    GangCompleted,
    GangFailed,
    GangGaveUp,
    GangRestarting,
    GangStarted,
    GangStopped,
    RankExited,
)
from gangline.agent.restart import RestartPolicy
from gangline.agent.runner import Gang, GangLaunch, Runner
from gangline.agent.settings import NodeAgentSettings
from gangline.agent.simulated import SimulatedGang, SimulatedRunner
from gangline.bus.consumer import EventConsumer
from gangline.bus.pools import PartitionOf, to_pool
from gangline.bus.producer import EventProducer
from gangline.core.health import GpuError, health_of
from gangline.core.pools import PoolLayout, PoolLayoutError
from gangline.events.allocations import AllocationGranted, AllocationReleased, MigSlice
from gangline.events.allocations import Placement as GrantPlacement
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.jobs import (
    JobAdmitted,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobPreempting,
    JobRequeued,
    JobResizing,
    JobSpec,
    JobStarted,
    WorkerExited,
)
from gangline.events.nodes import (
    GpuErrorReported,
    GpuHealthChanged,
    GpuInfo,
    GpuStatus,
    HealthCause,
    HealthState,
    MigInstance,
    NodeHeartbeat,
    NodeRegistered,
)
from gangline.events.types import AllocationId, GpuId, JobId, MiB, NodeId, Seconds
from gangline.fold.adapter import pool_labels
from gangline.nvml.health import (
    SEVERITY,
    Action,
    GpuHealthMonitor,
    HealthFinding,
    HealthPolicy,
    classify_xid,
)
from gangline.nvml.reader import NvmlApi, NvmlEventWatcher, NvmlReader
from gangline.nvml.standin import NvmlStandIn
from gangline.nvml.types import (
    GpuEvent,
    GpuEventKind,
    GpuHealthSample,
    GpuState,
    GpuUuid,
    MigDevice,
    NodeInventory,
)
from gangline.nvml.types import GpuInfo as NvmlGpuInfo

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"
_ID_NAMESPACE = uuid.UUID("a3d0c6f2-4b1e-4f58-8c2a-7e9b5d1f3c40")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MIG_PROFILE = re.compile(r"^[1-9][0-9]*g\.[1-9][0-9]*gb(\+[a-z]+)?$")
_MEMORY = 10_000
"""How many event ids / allocation ids / job specs the agent remembers (oldest forgotten first)."""

T = TypeVar("T")
StopReason = Literal["preempting", "released", "agent_stopping", "crashed", "time_limit"]
TIME_LIMIT_SLACK_S = 5.0
"""Each node of a gang enforces the limit from its own launch; a peer's ranks exiting this close to
the limit are the limit there, not a failure to restart the gang for."""


class Publisher(Protocol):
    """What the agent publishes with: :class:`gangline.bus.EventProducer` or a test double."""

    async def publish(self, topic: str, envelope: Envelope, *, key: str | None = None) -> Any: ...


@runtime_checkable
class BatchPublisher(Publisher, Protocol):
    """A publisher that sends many envelopes in one go (:meth:`gangline.bus.EventProducer.publish_many`):
    the outcome of each, in order (an error for those that failed)."""

    async def publish_many(self, items: Sequence[tuple[str, Envelope]]) -> Sequence[object]: ...


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _uuid4() -> str:
    return str(uuid.uuid4())


def derived_id(*parts: object) -> str:
    """A stable event id from what caused it (the allocation, the node, the rank ...)."""
    return str(uuid.uuid5(_ID_NAMESPACE, "/".join(map(str, parts))))


# ---- pure conversions --------------------------------------------------------------------------


def gpu_id(index: int) -> GpuId:
    """The id a GPU is known by in events and placements: ``gpu<NVML index>``."""
    return GpuId(f"gpu{index}")


def model_label(name: str | None) -> str:
    """NVML's product name as a topology-safe label: "NVIDIA H100 80GB HBM3" -> "H100-80GB-HBM3"."""
    text = (name or "").strip()
    for vendor in ("NVIDIA ", "Tesla "):
        text = text.removeprefix(vendor)
    return _UNSAFE.sub("-", text).strip("-._") or "unknown"


def registration(inventory: NodeInventory, settings: NodeAgentSettings) -> NodeRegistered:
    """``node.registered`` from an NVML inventory: the GPUs that answer, with MIG and NVLink facts.

    NVLink peers are the other GPUs of the same NVLink domain (direct links or a shared NVSwitch).
    GPUs that are lost or do not report their memory are left out (they cannot be scheduled).
    """
    usable = [g for g in inventory.gpus if g.state is GpuState.OK and g.memory_mib]
    ids = {g.uuid: gpu_id(g.index) for g in usable}
    domain_of = {u: d.id for d in inventory.nvlink_domains for u in d.gpus}
    members: dict[str, list[GpuUuid]] = {}
    for g in usable:
        members.setdefault(domain_of.get(g.uuid, g.uuid), []).append(g.uuid)
    gpus = []
    for g in usable:
        peers = [ids[u] for u in members[domain_of.get(g.uuid, g.uuid)] if u != g.uuid]
        migs = tuple(
            MigInstance(
                profile=m.profile,
                instance_id=m.gpu_instance_id,
                uuid=m.uuid,
                memory_mib=MiB(m.memory_mib),
                compute_instance_id=m.compute_instance_id,
                placement_start=m.placement_start,
            )
            for m in g.mig_devices
            if m.profile is not None
            and _MIG_PROFILE.match(m.profile)
            and m.gpu_instance_id is not None
            and m.memory_mib
        )
        gpus.append(
            GpuInfo(
                id=ids[g.uuid],
                index=g.index,
                uuid=g.uuid,
                model=model_label(g.name),
                memory_mib=MiB(int(g.memory_mib or 0)),
                mig_enabled=bool(g.mig_enabled),
                mig_instances=migs,
                nvlink_peers=tuple(peers),
            )
        )
    return NodeRegistered(
        node=NodeId(settings.node),
        address=settings.address,
        gpus=tuple(gpus),
        nvlink_domain=settings.domain,
        leaf=settings.leaf,
        spine=settings.spine,
        labels=dict(settings.labels),
        agent_version=AGENT_VERSION,
    )


def _is_slice(device: MigDevice, mig: MigSlice) -> bool:
    """Whether NVML's MIG ``device`` is the one the granted slice names (see ``_visible_devices``)."""
    if device.profile != mig.profile:
        return False
    if mig.instance_id is not None:
        return device.gpu_instance_id == mig.instance_id and (
            mig.compute_instance_id is None or device.compute_instance_id == mig.compute_instance_id
        )
    if mig.start is not None and device.placement_start is not None:
        return device.placement_start == mig.start
    return True


def _slice_name(mig: MigSlice) -> str:
    if mig.instance_id is not None:
        compute = (
            f", compute instance {mig.compute_instance_id}" if mig.compute_instance_id is not None else ""
        )
        return f"{mig.profile} (GPU instance {mig.instance_id}{compute})"
    if mig.start is not None:
        return f"{mig.profile} (at memory slice {mig.start})"
    return mig.profile


def health_state(verdict: Action | None) -> HealthState:
    """cordon -> failed, drain -> degraded; anything milder leaves the GPU healthy (the core's rule)."""
    return health_of(verdict)


def error_cause(error: GpuError) -> HealthCause:
    """The ``cause`` of a ``gpu.error_reported``: node_health counts it by the core's rate rule."""
    if error.xid is not None:
        rule = classify_xid(error.xid)
        return HealthCause(kind="xid", message=f"xid.{rule.xid}: {rule.meaning}", xid=rule.xid)
    n = error.count
    what = "error" if n == 1 else f"errors ({n} since the last sample)"
    return HealthCause(kind="ecc", message=f"ecc.sbe: correctable (single-bit) ECC {what}")


def health_cause(finding: HealthFinding | None) -> HealthCause:
    """The ``cause`` of a ``gpu.health_changed`` from the finding behind it (None: it recovered)."""
    if finding is None:
        return HealthCause(kind="recovered", message="no active health findings")
    code = finding.code
    family = code.split(".", 1)[0]
    message = f"{code}: {finding.reason}"
    if family == "xid":
        number = code.removeprefix("xid.")
        return HealthCause(kind="xid", message=message, xid=int(number) if number.isdigit() else None)
    if family == "gpu":
        return HealthCause(kind="lost", message=message)
    if family in ("temperature", "throttle"):
        return HealthCause(kind="thermal", message=message)
    return HealthCause(kind="ecc", message=message)


def master_port(allocation_id: str, settings: NodeAgentSettings) -> int:
    """The same port on every node of the gang, spread over ``master_port_span`` ports."""
    return settings.master_port_base + zlib.crc32(allocation_id.encode()) % settings.master_port_span


def exit_fields(returncode: int) -> tuple[int | None, int | None]:
    """(exit_code, signal) of a rank: negative return codes are deaths by that signal."""
    if returncode < 0 and -returncode <= 64:
        return None, -returncode
    return returncode, None


def is_failure(exited: WorkerExited) -> bool:
    return (exited.exit_code is not None and exited.exit_code != 0) or exited.signal is not None


class _Bounded:
    """Remembers the last ``size`` keys (an LRU set)."""

    def __init__(self, size: int = _MEMORY) -> None:
        self._size = size
        self._keys: OrderedDict[Hashable, None] = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._keys

    def add(self, key: Hashable) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self._size:
            self._keys.popitem(last=False)


# ---- the agent ---------------------------------------------------------------------------------


@dataclass
class LocalJob:
    """One allocation's ranks on this node, while they run."""

    job_id: JobId
    allocation_id: AllocationId
    grant_id: str
    hosts_rank0: bool
    attempt: int
    """The job's run (1, then 2 after a requeue ...): ``job.started.attempt``."""
    gpus_of_rank: dict[int, tuple[GpuId, ...]]
    whole_gpus: int
    """Whole GPUs of the gang (every node), for gpu_seconds."""
    launched_at: datetime
    gang: Gang | None = None
    task: asyncio.Task[None] | None = None
    stopping: StopReason | None = None
    cause_id: str | None = None
    """The event that asked this node to stop (job.preempting, allocation.released)."""
    started_reported: bool = False
    last_failure: GangFailed | None = None
    final: GangCompleted | GangGaveUp | GangStopped | None = None
    time_limit_s: int | None = None
    limit_at: datetime | None = None
    """When this node stops the job for its time limit (None: no limit)."""
    limit_timer: asyncio.TimerHandle | None = None


@dataclass
class _PendingGrant:
    envelope: Envelope
    deadline: float


class NodeAgent:
    """One node's agent. ``start()`` / ``stop()``, or ``async with``. See the module docstring."""

    def __init__(
        self,
        settings: NodeAgentSettings,
        *,
        nvml_api: NvmlApi,
        runner: Runner,
        producer: Publisher | None = None,
        consume: bool = True,
        clock: Callable[[], datetime] = _utcnow,
        new_id: Callable[[], str] = _uuid4,
        health_policy: HealthPolicy | None = None,
    ) -> None:
        """``producer``: shared and left running by :meth:`stop` when given; else the agent owns one.

        ``consume=False``: no consumer of its own; the caller feeds events to :meth:`handle`.
        """
        self.settings = settings
        self.runner = runner
        self._api = nvml_api
        self._reader = NvmlReader(nvml_api, node=settings.node)
        self._watcher: NvmlEventWatcher | None = None
        self._producer = producer
        self._own_producer: EventProducer | None = None
        self._consume = consume
        self._consumer: EventConsumer | None = None
        self._clock = clock
        self._new_id = new_id
        self._monitor = GpuHealthMonitor(health_policy)

        self._inventory: NodeInventory | None = None
        self._registration: NodeRegistered | None = None
        self._id_of: dict[GpuUuid, GpuId] = {}
        self._nvml_gpu: dict[GpuId, NvmlGpuInfo] = {}
        self._health: dict[GpuId, HealthState] = {}
        self._last_sample: dict[GpuId, GpuHealthSample] = {}
        self._xids: dict[tuple[GpuId, int], int] = {}
        self._seq = 0
        self._heartbeats_on = True

        self._seen_events = _Bounded()
        self._seen_allocations = _Bounded()
        self._specs: OrderedDict[str, JobSpec] = OrderedDict()
        self._job_attempts: OrderedDict[str, int] = OrderedDict()
        self._jobs: dict[str, LocalJob] = {}
        self._pending: dict[str, _PendingGrant] = {}
        self._after_stop: dict[str, Envelope] = {}
        """Resize grants waiting for the ranks of the allocation they replace to stop here."""

        self._outbox: asyncio.Queue[tuple[str, Envelope]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._consume_task: asyncio.Task[None] | None = None
        self._side_tasks: set[asyncio.Task[Any]] = set()
        self._publisher: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._crashed = False
        self._ended = asyncio.Event()
        self._fault: BaseException | None = None
        self.published: int = 0
        """Envelopes handed to the broker so far."""

    # ---- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> NodeAgent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Read the inventory, register, and start heartbeats, health watching and grant handling.

        Returns once the consumer owns its partitions, so events published after ``start()`` are seen.
        """
        if self._started:
            raise RuntimeError("the agent was already started")
        self._started = True
        s = self.settings
        inventory = await self._nvml(self._reader.inventory)
        self._adopt_inventory(inventory)
        if self._producer is None:
            self._own_producer = EventProducer(
                s.kafka_bootstrap,
                client_id=f"gangline-agent-{s.node}",
                partition_of=self._pool_partition(),
            )
            await self._own_producer.start()
            self._producer = self._own_producer
        self._publisher = asyncio.create_task(self._publish_loop(), name=f"agent-{s.node}-publish")
        self._publisher.add_done_callback(self._loop_done)
        assert self._registration is not None
        self._enqueue(s.topics.inventory, self._envelope(self._registration, self._new_id()))

        self._watcher = self._reader.event_watcher()
        for issue in self._watcher.start():
            log.warning("agent %s: NVML event registration issue: %s %s", s.node, issue.call, issue.error)
        if self._consume:
            self._consumer = EventConsumer(
                s.kafka_bootstrap,
                [s.topics.allocations, s.topics.events],
                service=f"agent-{s.node}",
                group_id=s.consumer_group,
                auto_offset_reset=s.start_from,
            )
            await self._consumer.start()
            await self._consumer.wait_for_assignment()
            self._consume_task = asyncio.create_task(self._consume_loop(), name=f"agent-{s.node}-consume")
            self._consume_task.add_done_callback(self._loop_done)
        self._tasks.append(asyncio.create_task(self._heartbeat_loop(), name=f"agent-{s.node}-heartbeat"))
        self._tasks.append(asyncio.create_task(self._watch_loop(), name=f"agent-{s.node}-xid"))
        for task in self._tasks:
            task.add_done_callback(self._loop_done)
        log.info("agent %s: started with %d GPUs", s.node, len(self._registration.gpus))

    async def serve(self) -> None:
        """``start()``, then run until cancelled (``run_service`` on SIGTERM), crashed, or a loop fails.

        Always ends with a graceful :meth:`stop`; a failed loop is raised after it.
        """
        await self.start()
        try:
            await self._ended.wait()
        finally:
            await self.stop()
        if self._fault is not None:
            raise RuntimeError(f"agent {self.node} stopped: a loop failed") from self._fault

    def _pool_partition(self) -> PartitionOf | None:
        """With pools: all this agent writes goes to its node's pool's partition (gangline.bus.pools)."""
        s = self.settings
        if s.pools is None or self._registration is None:
            return None
        layout = PoolLayout.parse(s.pools)
        pool = layout.pool_of(pool_labels(self._registration))
        if pool is None:
            raise PoolLayoutError(f"node {s.node}: its {layout.label} names no pool of {list(layout.pools)}")
        topics = s.topics
        return to_pool(
            layout.partition(pool), [topics.events, topics.inventory, topics.heartbeats, topics.health]
        )

    async def stop(self) -> None:
        """Graceful: stop taking events, stop every gang (``stop_grace_s``), publish what is left, close."""
        if self._closed or not self._started:
            return
        self._closed = True
        self._ended.set()
        if self._consume_task is not None:  # handle() never suspends: this lands in the poll or commit
            await self._cancel([self._consume_task])
        stops = [self._stop_job(job, "agent_stopping", None) for job in list(self._jobs.values())]
        await asyncio.gather(*stops, return_exceptions=True)
        jobs = [job.task for job in self._jobs.values() if job.task is not None]
        await asyncio.gather(*jobs, return_exceptions=True)
        await self._cancel(self._tasks)
        await self._cancel(list(self._side_tasks))
        await self.flush()
        await self._shutdown_io()
        log.info("agent %s: stopped", self.settings.node)

    async def crash(self) -> None:
        """Die like a node that lost power: nothing more is published, ranks are killed, nothing committed."""
        if self._closed or not self._started:
            return
        self._closed = self._crashed = True
        self._ended.set()
        await self._cancel([t for t in (self._consume_task, *self._tasks) if t is not None])
        for job in list(self._jobs.values()):
            job.stopping = "crashed"
            if job.gang is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(job.gang.preempt(9, 0.0), timeout=5.0)
        await self._cancel([job.task for job in self._jobs.values() if job.task is not None])
        await self._cancel(list(self._side_tasks))
        while not self._outbox.empty():
            self._outbox.get_nowait()
            self._outbox.task_done()
        await self._shutdown_io(commit=False)
        log.warning("agent %s: crashed (simulated)", self.settings.node)

    async def flush(self) -> None:
        """Until everything enqueued so far has been published."""
        if self._publisher is not None and not self._publisher.done():
            await self._outbox.join()

    # ---- failure injection ------------------------------------------------------------------------

    def stop_heartbeats(self) -> None:
        """Go silent on nodes.heartbeats (a hung node); everything else carries on."""
        self._heartbeats_on = False

    def resume_heartbeats(self) -> None:
        self._heartbeats_on = True

    def inject_xid(self, gpu: str | int, code: int) -> None:
        """Make the NVML stand-in raise XID ``code`` on ``gpu`` (an id like "gpu1", or an index).

        79 also takes the GPU off the bus and 48 records the ECC error, as the hardware would.
        """
        if not isinstance(self._api, NvmlStandIn):
            raise TypeError("inject_xid needs the NVML stand-in, not a real NVML")
        index = gpu if isinstance(gpu, int) else self._index_of(gpu)
        if code == 79:
            self._api.fall_off_bus(index)
        elif code == 48:
            self._api.double_bit_ecc(index)
        else:
            self._api.xid(index, code)

    # ---- what it knows ------------------------------------------------------------------------------

    @property
    def node(self) -> str:
        return self.settings.node

    @property
    def registration(self) -> NodeRegistered:
        if self._registration is None:
            raise RuntimeError("the agent has not read its inventory yet (call start())")
        return self._registration

    @property
    def inventory(self) -> NodeInventory:
        """What NVML reported at start (with read issues)."""
        if self._inventory is None:
            raise RuntimeError("the agent has not read its inventory yet (call start())")
        return self._inventory

    @property
    def jobs(self) -> dict[str, LocalJob]:
        """The allocations running here, by job id."""
        return dict(self._jobs)

    @property
    def health(self) -> dict[GpuId, HealthState]:
        return dict(self._health)

    @property
    def gpu_samples(self) -> Mapping[GpuId, GpuHealthSample]:
        """Each GPU's latest health sample (temperature, ECC, remapped rows), read every heartbeat."""
        return self._last_sample

    @property
    def xid_errors(self) -> Mapping[tuple[GpuId, int], int]:
        """How many XID events of each code each GPU reported since the agent started."""
        return self._xids

    @property
    def heartbeats_sent(self) -> int:
        return self._seq

    # ---- events in --------------------------------------------------------------------------------

    async def handle(self, envelope: Envelope) -> None:
        """React to one event of allocations.log or jobs.events; each event id is handled once."""
        if self._closed or envelope.id in self._seen_events:
            return
        self._seen_events.add(envelope.id)
        data = envelope.data
        if isinstance(data, AllocationGranted):
            await self._on_granted(envelope, data)
        elif isinstance(data, AllocationReleased):
            self._on_released(envelope, data)
        elif isinstance(data, JobAdmitted):
            self._remember(self._specs, data.job_id, data.spec)
            await self._retry_pending()
        elif isinstance(data, JobRequeued):
            self._remember(self._job_attempts, data.job_id, data.attempt)
        elif isinstance(data, JobPreempting | JobResizing):
            self._on_preempting(envelope, data)
        elif isinstance(data, WorkerExited):
            self._on_worker_exited(data)

    async def _on_granted(self, envelope: Envelope, grant: AllocationGranted) -> None:
        if not any(p.node == self.node for p in grant.placements):
            return
        if grant.allocation_id in self._seen_allocations or grant.allocation_id in self._pending:
            log.info("agent %s: allocation %s already handled", self.node, grant.allocation_id)
            return
        if grant.job_id not in self._specs and self.settings.spec_wait_s > 0:
            loop = asyncio.get_running_loop()
            self._pending[grant.allocation_id] = _PendingGrant(
                envelope, loop.time() + self.settings.spec_wait_s
            )
            return
        self._launch(envelope, grant)

    async def _retry_pending(self) -> None:
        now = asyncio.get_running_loop().time()
        for allocation_id, pending in list(self._pending.items()):
            grant = pending.envelope.data
            assert isinstance(grant, AllocationGranted)
            if grant.job_id in self._specs or now >= pending.deadline:
                del self._pending[allocation_id]
                if grant.job_id not in self._specs:
                    log.warning(
                        "agent %s: no job.admitted seen for %s; starting it with the defaults",
                        self.node,
                        grant.job_id,
                    )
                self._launch(pending.envelope, grant)

    def _launch(self, envelope: Envelope, grant: AllocationGranted) -> None:
        s = self.settings
        running = self._jobs.get(grant.job_id)
        if running is not None and grant.resizes == running.allocation_id and running.stopping is not None:
            # An elastic resize: the ranks of the allocation it replaces are still stopping here.
            self._after_stop[grant.job_id] = envelope
            return
        self._seen_allocations.add(grant.allocation_id)
        if grant.job_id in self._jobs:
            log.warning(
                "agent %s: %s still runs allocation %s here; grant %s ignored",
                self.node,
                grant.job_id,
                self._jobs[grant.job_id].allocation_id,
                grant.allocation_id,
            )
            return
        spec = self._specs.get(grant.job_id)
        mine = [p for p in grant.placements if p.node == self.node]
        job = LocalJob(
            job_id=grant.job_id,
            allocation_id=grant.allocation_id,
            grant_id=envelope.id,
            hosts_rank0=any(p.rank == 0 for p in mine),
            attempt=self._job_attempts.get(grant.job_id, 1),
            gpus_of_rank={p.rank: p.gpus for p in mine},
            whole_gpus=grant.whole_gpus,
            launched_at=self._clock(),
        )
        try:
            taken: set[str] = set()
            ranks, rendezvous = layout_for_node(
                [self._layout_placement(p, taken) for p in sorted(grant.placements, key=lambda p: p.rank)],
                self.node,
                master_port=master_port(grant.allocation_id, s),
                address_of=s.address_of,
            )
            launch = GangLaunch(
                job_id=grant.job_id,
                allocation_id=grant.allocation_id,
                ranks=ranks,
                rendezvous=rendezvous,
                checkpoint_dir=checkpoint_dir_for(s.checkpoint_root, grant.job_id),
                log_dir=s.log_dir,
                policy=RestartPolicy(
                    mode=s.restart_policy, max_restarts=s.max_restarts, backoff_initial_s=s.restart_backoff_s
                ),
                command=(spec.command if spec is not None and spec.command else s.default_command),
                env=dict(spec.env) if spec is not None else {},
                duration_hint_s=spec.duration_hint_s if spec is not None else None,
                teardown_grace_s=s.stop_grace_s,
            )
            job.gang = self.runner.gang(launch, functools.partial(self._on_gang_event, job))
        except (ValueError, KeyError) as err:
            log.error("agent %s: cannot launch %s: %s", self.node, grant.job_id, err)
            if job.hosts_rank0:
                failed = JobFailed(
                    job_id=job.job_id,
                    allocation_id=job.allocation_id,
                    code="launch_failed",
                    reason=f"node {self.node} could not launch the job: {err}",
                    gpu_seconds=self._gpu_seconds(job),
                )
                self._publish_job_event(job, failed, "failed", cause=envelope.id)
            return
        self._jobs[grant.job_id] = job
        job.task = asyncio.create_task(self._run_gang(job), name=f"agent-{self.node}-{grant.job_id}")
        if spec is not None and spec.time_limit_s is not None:
            self._arm_time_limit(job, spec)
        log.info("agent %s: launched %s ranks %s", self.node, grant.job_id, sorted(job.gpus_of_rank))

    def _layout_placement(self, p: GrantPlacement, taken: set[str]) -> LayoutPlacement:
        if p.node != self.node:
            return LayoutPlacement(rank=p.rank, node=p.node, gpus=p.gpus)
        return LayoutPlacement(rank=p.rank, node=p.node, gpus=self._visible_devices(p, taken))

    def _visible_devices(self, p: GrantPlacement, taken: set[str]) -> tuple[str, ...]:
        """What CUDA_VISIBLE_DEVICES takes for a placement here: GPU UUIDs, or the MIG device's UUID.

        A slice names its MIG device by NVML's GPU-instance (and compute-instance) id; without them,
        a free device of its profile whose GPU instance starts at the slice's ``start`` (when NVML
        said where its instances sit), else the first free one of the profile (``taken`` across ranks).
        """
        out: list[str] = []
        for gid in p.gpus:
            info = self._nvml_gpu.get(gid)
            if info is None:
                raise KeyError(f"placement names GPU {gid!r}, which node {self.node} does not have")
            if p.mig is not None:
                mig = next((m for m in info.mig_devices if m.uuid not in taken and _is_slice(m, p.mig)), None)
                if mig is None:
                    raise KeyError(f"GPU {gid!r} has no free MIG device {_slice_name(p.mig)}")
                taken.add(mig.uuid)
                out.append(mig.uuid)
            else:
                out.append(info.uuid)
        return tuple(out)

    async def _run_gang(self, job: LocalJob) -> None:
        assert job.gang is not None
        try:
            await job.gang.run()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.exception("agent %s: gang of %s crashed", self.node, job.job_id)
            if job.final is None and job.hosts_rank0 and not self._crashed:
                failed = JobFailed(
                    job_id=job.job_id,
                    allocation_id=job.allocation_id,
                    code="agent_error",
                    reason=f"node {self.node} lost track of the job: {type(err).__name__}: {err}",
                    gpu_seconds=self._gpu_seconds(job),
                )
                self._publish_job_event(job, failed, "failed", cause=job.grant_id)
        finally:
            if job.limit_timer is not None:
                job.limit_timer.cancel()
            if self._jobs.get(job.job_id) is job:
                del self._jobs[job.job_id]
            resized = self._after_stop.pop(job.job_id, None)
            if resized is not None and not self._closed:
                grant = resized.data
                assert isinstance(grant, AllocationGranted)
                self._launch(resized, grant)  # the new size, from the checkpoint just written

    def _arm_time_limit(self, job: LocalJob, spec: JobSpec) -> None:
        assert spec.time_limit_s is not None
        wall_s = float(spec.time_limit_s)
        if isinstance(self.runner, SimulatedRunner):
            wall_s *= self.runner.time_scale
        job.time_limit_s = spec.time_limit_s
        job.limit_at = job.launched_at + timedelta(seconds=wall_s)
        grace = min(float(spec.checkpoint_grace_s), self.settings.max_grace_s)
        loop = asyncio.get_running_loop()
        job.limit_timer = loop.call_later(wall_s, self._time_limit_reached, job, grace)

    def _time_limit_reached(self, job: LocalJob, grace_s: float) -> None:
        """The limit: ask the ranks to checkpoint (the preemption signal) and stop them after the grace."""
        if self._closed or job.stopping is not None or job.final is not None or job.gang is None:
            return
        log.warning(
            "agent %s: %s reached its time limit of %s s; checkpoint signal, %.0f s grace",
            self.node,
            job.job_id,
            job.time_limit_s,
            grace_s,
        )
        # marked before any await: the ranks' exits from here on are the limit, not failures
        job.stopping = "time_limit"
        self._spawn(self._preempt(job, grace_s))

    def _on_released(self, envelope: Envelope, released: AllocationReleased) -> None:
        pending = self._pending.pop(released.allocation_id, None)
        if pending is not None:
            self._seen_allocations.add(released.allocation_id)  # released before it ever started
            return
        job = self._jobs.get(released.job_id)
        if job is None or job.allocation_id != released.allocation_id or job.final is not None:
            return
        if job.stopping is None:  # before any await, as for job.preempting
            job.stopping, job.cause_id = "released", envelope.id
        self._spawn(self._stop_job(job, "released", envelope.id))

    def _on_preempting(self, envelope: Envelope, preempting: JobPreempting | JobResizing) -> None:
        """Checkpoint and stop the ranks by the deadline: for a preemption, or for an elastic resize
        (the job comes back at its new size in the grant that names this allocation)."""
        job = self._jobs.get(preempting.job_id)
        if job is None or job.allocation_id != preempting.allocation_id or job.stopping is not None:
            return
        grace = (preempting.deadline - self._clock()).total_seconds()
        grace = min(max(grace, 0.0), self.settings.max_grace_s)
        # marked before any await: peers' exits from here on are the preemption, not failures
        job.stopping, job.cause_id = "preempting", envelope.id
        self._spawn(self._preempt(job, grace))

    def _on_worker_exited(self, exited: WorkerExited) -> None:
        if exited.node == self.node or not is_failure(exited):
            return
        job = self._jobs.get(exited.job_id)
        if job is None or job.allocation_id != exited.allocation_id or job.stopping is not None:
            return
        if job.limit_at is not None and self._clock() >= job.limit_at - timedelta(seconds=TIME_LIMIT_SLACK_S):
            if job.limit_timer is not None:
                job.limit_timer.cancel()
            spec = self._specs.get(job.job_id)
            grace = float(spec.checkpoint_grace_s) if spec is not None else 0.0
            self._time_limit_reached(job, min(grace, self.settings.max_grace_s))
            return
        if job.gang is not None:
            log.info(
                "agent %s: %s rank %d failed on %s (attempt %d); tearing down ours",
                self.node,
                exited.job_id,
                exited.rank,
                exited.node,
                exited.restarts,
            )
            self._spawn(job.gang.peer_failed(exited.restarts))

    async def _preempt(self, job: LocalJob, grace_s: float) -> None:
        assert job.gang is not None
        result = await job.gang.preempt(self.settings.preempt_signal, grace_s)
        log.info(
            "agent %s: %s checkpoint %s (acked %s of %s, killed %s)",
            self.node,
            job.job_id,
            "acknowledged" if result.acknowledged else "NOT acknowledged",
            list(result.acked),
            list(result.ranks),
            list(result.killed),
        )

    async def _stop_job(self, job: LocalJob, reason: StopReason, cause: str | None) -> None:
        if job.stopping is None:
            job.stopping, job.cause_id = reason, cause
        if job.gang is not None:
            await job.gang.preempt(self.settings.preempt_signal, self.settings.stop_grace_s)

    # ---- gang events out --------------------------------------------------------------------------

    def _on_gang_event(self, job: LocalJob, event: AgentEvent) -> None:
        if self._crashed:
            return
        if isinstance(event, GangStarted):
            if job.hosts_rank0 and not job.started_reported:
                job.started_reported = True
                started = JobStarted(job_id=job.job_id, allocation_id=job.allocation_id, attempt=job.attempt)
                self._publish_job_event(job, started, "started", cause=job.grant_id)
        elif isinstance(event, RankExited):
            code, sig = exit_fields(event.returncode)
            exited = WorkerExited(
                job_id=job.job_id,
                allocation_id=job.allocation_id,
                rank=event.rank,
                node=NodeId(self.node),
                exit_code=code,
                signal=sig,
                restarts=event.attempt,
                gpus=job.gpus_of_rank.get(event.rank, ()),
            )
            self._publish_job_event(job, exited, "exited", event.attempt, event.rank, cause=job.grant_id)
        elif isinstance(event, GangFailed):
            job.last_failure = event
            log.warning(
                "agent %s: %s attempt %d failed (%s)", self.node, job.job_id, event.attempt, event.reason
            )
        elif isinstance(event, GangRestarting):
            log.info("agent %s: %s restarts as attempt %d", self.node, job.job_id, event.attempt)
        elif isinstance(event, GangCompleted):
            job.final = event
            if job.hosts_rank0 and job.stopping is None:
                held = self._gpu_seconds(job)
                done = JobCompleted(job_id=job.job_id, allocation_id=job.allocation_id, gpu_seconds=held)
                self._publish_job_event(job, done, "completed", cause=job.grant_id)
        elif isinstance(event, GangGaveUp):
            job.final = event
            if job.hosts_rank0 and job.stopping is None:
                self._publish_job_event(job, self._job_failed(job, event), "failed", cause=job.grant_id)
        elif isinstance(event, GangStopped):
            job.final = event
            if job.stopping == "time_limit":
                self._on_time_limit_stopped(job, event)
            elif job.stopping == "preempting" and event.checkpoint.acknowledged:
                checkpointed = JobCheckpointed(
                    job_id=job.job_id,
                    allocation_id=job.allocation_id,
                    node=NodeId(self.node),
                    checkpoint=str(event.checkpoint.checkpoint_dir),
                )
                self._publish_job_event(job, checkpointed, "checkpointed", cause=job.cause_id)

    def _on_time_limit_stopped(self, job: LocalJob, stopped: GangStopped) -> None:
        result = stopped.checkpoint
        if result.acknowledged:
            checkpointed = JobCheckpointed(
                job_id=job.job_id,
                allocation_id=job.allocation_id,
                node=NodeId(self.node),
                checkpoint=str(result.checkpoint_dir),
            )
            self._publish_job_event(job, checkpointed, "checkpointed", "time-limit", cause=job.grant_id)
        if not job.hosts_rank0:
            return
        how = (
            "it checkpointed after the signal"
            if result.acknowledged
            else f"ranks {list(result.killed)} were killed after the grace"
            if result.killed
            else "it exited after the signal"
        )
        failed = JobFailed(
            job_id=job.job_id,
            allocation_id=job.allocation_id,
            code="time_limit",
            reason=f"the job reached its time limit of {job.time_limit_s} s on {self.node}; {how}",
            gpu_seconds=self._gpu_seconds(job),
        )
        self._publish_job_event(job, failed, "failed", cause=job.grant_id)

    def _job_failed(self, job: LocalJob, gave_up: GangGaveUp) -> JobFailed:
        last = job.last_failure
        where = ""
        if last is not None and last.rank is not None:
            where = f"; last failure: rank {last.rank} exited {last.returncode}"
        elif last is not None:
            where = f"; last failure: {last.reason}"
        return JobFailed(
            job_id=job.job_id,
            allocation_id=job.allocation_id,
            code="restarts_exhausted" if gave_up.failures > 1 else "worker_exit",
            reason=f"{gave_up.reason}{where}",
            exit_code=last.returncode if last is not None else None,
            gpu_seconds=self._gpu_seconds(job),
        )

    def _gpu_seconds(self, job: LocalJob) -> Seconds:
        """GPU-seconds the gang held, in the job's time (a simulated runner's seconds are scaled)."""
        held = (self._clock() - job.launched_at).total_seconds()
        if isinstance(self.runner, SimulatedRunner) and self.runner.time_scale > 0:
            held /= self.runner.time_scale
        return Seconds(max(0, int(held * job.whole_gpus)))

    def _publish_job_event(self, job: LocalJob, data: Event, *parts: object, cause: str | None) -> None:
        event_id = derived_id(job.allocation_id, self.node, *parts)
        self._enqueue(self.settings.topics.events, self._envelope(data, event_id, cause))

    # ---- heartbeats and health --------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        s = self.settings
        while True:
            try:
                samples, issues = await self._nvml(self._reader.sample)
                for issue in issues:
                    log.debug("agent %s: NVML sample issue %s %s", s.node, issue.call, issue.error)
                now = self._clock()
                for sample in samples:
                    gid = self._id_of.get(sample.uuid)
                    if gid is not None:
                        self._last_sample[gid] = sample
                    self._apply(self._monitor.observe_sample(sample, now))
                    self._report_errors()
                if self._heartbeats_on:
                    self._enqueue(s.topics.heartbeats, self._envelope(self._heartbeat(), self._new_id()))
                    self._seq += 1
                if self._pending:  # grants whose spec never came start with the defaults
                    await self._retry_pending()
            except Exception:
                log.exception("agent %s: heartbeat failed", s.node)
            await asyncio.sleep(s.heartbeat_interval_s)

    def _heartbeat(self) -> NodeHeartbeat:
        busy = {g for job in self._jobs.values() for gpus in job.gpus_of_rank.values() for g in gpus}
        statuses = []
        for gid in sorted(self._nvml_gpu, key=lambda g: self._nvml_gpu[g].index):
            sample = self._last_sample.get(gid)
            temp = sample.temperature_c if sample is not None else None
            statuses.append(
                GpuStatus(
                    id=gid,
                    healthy=self._health.get(gid, "healthy") == "healthy",
                    busy=gid in busy,
                    temperature_c=temp if temp is not None and -50 <= temp <= 200 else None,
                )
            )
        return NodeHeartbeat(node=NodeId(self.node), seq=self._seq, gpus=tuple(statuses))

    async def _watch_loop(self) -> None:
        s = self.settings
        watcher = self._watcher
        assert watcher is not None
        while True:
            try:
                result = await self._nvml(watcher.poll, s.xid_poll_ms)
                for issue in result.issues:
                    log.debug("agent %s: NVML event issue %s %s", s.node, issue.call, issue.error)
                now = self._clock()
                for event in result.events:
                    self._count_xid(event)
                    findings = self._monitor.observe_event(event, now)
                    self._apply(findings)
                    self._report_errors()
                    self._fail_jobs_on(findings)
            except Exception:
                log.exception("agent %s: XID watcher failed", s.node)
                result = None
            if result is None or not result.events:
                await asyncio.sleep(s.xid_idle_s)

    def _count_xid(self, event: GpuEvent) -> None:
        gid = self._id_of.get(event.uuid) if event.uuid is not None else None
        if event.kind is GpuEventKind.XID and event.xid is not None and gid is not None:
            key = (gid, int(event.xid))
            self._xids[key] = self._xids.get(key, 0) + 1

    def _apply(self, findings: list[HealthFinding]) -> None:
        """Publish ``gpu.health_changed`` for every GPU whose state moved (findings may also clear)."""
        new_by_gpu = {f.gpu: f for f in findings}
        for uuid_, gid in self._id_of.items():
            state = health_state(self._monitor.verdict(uuid_))
            previous = self._health.get(gid, "healthy")
            if state == previous:
                continue
            self._health[gid] = state
            active = sorted(self._monitor.active(uuid_), key=lambda f: -SEVERITY[f.action])
            finding = new_by_gpu.get(uuid_) or (active[0] if active else None)
            cause = health_cause(finding if state != "healthy" else None)
            changed = GpuHealthChanged(
                node=NodeId(self.node), gpu=gid, previous=previous, state=state, cause=cause
            )
            log.warning("agent %s: %s %s -> %s (%s)", self.node, gid, previous, state, cause.message)
            self._enqueue(self.settings.topics.health, self._envelope(changed, self._new_id()))

    def _report_errors(self) -> None:
        """Each countable error (job-fault / warning XID, correctable ECC: none changes the GPU's state by
        itself) for node_health's rates (``report_repeated_errors``; off, none is drained for them)."""
        errors = self._monitor.take_errors()
        if not self.settings.report_repeated_errors:
            return
        for uuid_, error in errors:
            gid = self._id_of.get(uuid_)
            if gid is None:
                continue
            state = self._health.get(gid, "healthy")
            report = GpuErrorReported(
                node=NodeId(self.node), gpu=gid, state=state, cause=error_cause(error), count=error.count
            )
            self._enqueue(self.settings.topics.health, self._envelope(report, self._new_id()))

    def _fail_jobs_on(self, findings: list[HealthFinding]) -> None:
        """A simulated rank on a GPU whose fault kills the job dies, as its process would."""
        for finding in findings:
            if not finding.fails_job:
                continue
            gid = self._id_of.get(finding.gpu)
            for job in self._jobs.values():
                if isinstance(job.gang, SimulatedGang) and job.stopping is None:
                    for rank, gpus in job.gpus_of_rank.items():
                        if gid in gpus:
                            job.gang.fail(rank, exit_code=1)

    # ---- plumbing ---------------------------------------------------------------------------------

    def _adopt_inventory(self, inventory: NodeInventory) -> None:
        if not inventory.nvml_available:
            log.error("agent %s: NVML unavailable: %s", self.node, [i.error for i in inventory.issues])
        self._inventory = inventory
        self._registration = registration(inventory, self.settings)
        self._nvml_gpu = {gpu_id(g.index): g for g in inventory.gpus if g.state is GpuState.OK}
        self._id_of = {g.uuid: gid for gid, g in self._nvml_gpu.items()}
        self._health = {gid: "healthy" for gid in self._nvml_gpu}

    def _index_of(self, gid: str) -> int:
        info = self._nvml_gpu.get(GpuId(gid))
        if info is None:
            raise KeyError(f"node {self.node} has no GPU {gid!r}")
        return info.index

    def _envelope(self, data: Event, event_id: str, cause: str | None = None) -> Envelope:
        return make_envelope(
            data, event_id=event_id, source=self.settings.source, time=self._clock(), causationid=cause
        )

    def _enqueue(self, topic: str, envelope: Envelope) -> None:
        if not self._crashed:
            self._outbox.put_nowait((topic, envelope))

    async def _publish_loop(self) -> None:
        """Publish the outbox in order. With a :class:`BatchPublisher` everything queued meanwhile goes
        in one send (a gang's exits and checkpoints after a preemption: one round trip, not one each)."""
        producer = self._producer
        assert producer is not None
        while True:
            batch = [await self._outbox.get()]
            while not self._outbox.empty():
                batch.append(self._outbox.get_nowait())
            try:
                outcomes = await self._publish_batch(producer, batch)
                for (topic, envelope), outcome in zip(batch, outcomes, strict=True):
                    if isinstance(outcome, BaseException):
                        log.error(
                            "agent %s: could not publish %s to %s",
                            self.node,
                            envelope.type,
                            topic,
                            exc_info=outcome,
                        )
                    else:
                        self.published += 1
            finally:
                for _ in batch:
                    self._outbox.task_done()

    @staticmethod
    async def _publish_batch(producer: Publisher, batch: list[tuple[str, Envelope]]) -> Sequence[object]:
        if isinstance(producer, BatchPublisher) and len(batch) > 1:
            return await producer.publish_many(batch)
        outcomes: list[object] = []
        for topic, envelope in batch:
            try:
                outcomes.append(await producer.publish(topic, envelope))
            except asyncio.CancelledError:
                raise
            except Exception as err:
                outcomes.append(err)
        return outcomes

    async def _consume_loop(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while True:
            deliveries = await consumer.getmany(timeout_ms=self.settings.poll_timeout_ms)
            for delivery in deliveries:
                try:
                    await self.handle(delivery.envelope)
                except Exception:  # bad input never stops the agent
                    log.exception("agent %s: handling %s failed", self.node, delivery.envelope.type)
            if self._pending:
                await self._retry_pending()
            if deliveries:
                await consumer.commit()

    async def _nvml(self, call: Callable[..., T], *args: Any) -> T:
        """Real NVML blocks (event waits, slow counters): a worker thread. The stand-in answers at once."""
        if isinstance(self._api, NvmlStandIn):
            return call(*args)
        return await asyncio.to_thread(call, *args)

    def _loop_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        log.error("agent %s: %s failed", self.node, task.get_name(), exc_info=task.exception())
        self._fault = task.exception()
        self._ended.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_done)

    def _side_done(self, task: asyncio.Task[Any]) -> None:
        self._side_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("agent %s: background step failed", self.node, exc_info=task.exception())

    @staticmethod
    def _remember(store: OrderedDict[str, Any], key: str, value: Any) -> None:
        store[key] = value
        store.move_to_end(key)
        while len(store) > _MEMORY:
            store.popitem(last=False)

    @staticmethod
    async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _shutdown_io(self, *, commit: bool = True) -> None:
        if self._publisher is not None:
            await self._cancel([self._publisher])
        if self._watcher is not None:
            self._watcher.close()
        self._reader.close()
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            if commit:
                with contextlib.suppress(Exception):
                    await consumer.commit()
            await consumer.stop()
        if self._own_producer is not None:
            producer, self._own_producer = self._own_producer, None
            await producer.stop()
