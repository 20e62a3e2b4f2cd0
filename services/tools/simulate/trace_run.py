"""A trace through the services' own decisions: the figures `gangline simulate` reports, measured on
:class:`~services.tools.simulate.engine.ServiceSimulation` instead of the core's simulator.

The cluster is a cluster spec (:mod:`gangline.cluster_spec`, ``deploy/clusters/*.yaml``).
What it takes to run the services on one:

* **nodes**: the spec's registrations (:meth:`~gangline.cluster_spec.ClusterSpec.registrations`, what
  fake-nodes sends, with the node ids, GPU ids and labels of the core simulator's nodes) are the
  ``node.registered`` the simulated agents send. Shared (milli-GPU) groups have no registration
  format yet: such a spec is refused.
* **queues**: a queues file (the services' queue configuration, :mod:`services.common.queues`);
  without one every trace queue is unlimited (no quota, as the core's simulator runs without one).
* **jobs**: each trace job is a ``job.requested`` at its submit time with its shape, queue, priority,
  preemptibility and ``duration_hint_s`` (its run time, rounded up); the simulated nodes complete it
  that long after its start (less the work saved at a checkpoint, when it resumes).

Measured as `gangline simulate` measures (:class:`gangline.sim.metrics.Recorder`): a job is submitted
when its request is sent, starts at each grant, ends at its ``completed`` release, and is preempted at
each ``preempted`` / ``node_failed`` release (losing the run time its checkpoint did not keep). Jobs
admission rejects stay waiting to the end (unfinished), as the core's simulator keeps jobs that never
fit; ``rejected`` counts them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gangline.cluster_spec import ClusterSpec
from gangline.core.defaults import default_profile, placement_registry
from gangline.core.framework.profile import load_profile_file
from gangline.core.model import GpuMode, Job, JobId, QueueName
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.ids import derived_id
from gangline.events.jobs import MAX_TIME_LIMIT_S, JobPreempting, JobRejected, JobRequested, Topology
from gangline.events.nodes import NodeRegistered
from gangline.sim.metrics import Recorder, RunResult
from gangline.sim.run import entitlement_weights
from gangline.sim.trace import TraceJob
from services.common.queues import Queues, QueuesFile, load_queues, queues_of
from services.preemption.handlers import preemption_reason
from services.tools.simulate.engine import (
    HeartbeatMode,
    NodeOptions,
    Observer,
    ServiceOptions,
    ServiceSimulation,
    Transaction,
)

PRODUCER = "gangline/simulate"


class UnsupportedSpec(ValueError):
    """A cluster spec the services cannot be run on (the message says why)."""


def registrations(spec: ClusterSpec) -> list[NodeRegistered]:
    """The spec's nodes as their agents register them (see the module docstring)."""
    for group in spec.groups:
        if group.gpu_mode is not GpuMode.WHOLE:
            raise UnsupportedSpec(
                f"group {group.name}: shared GPUs cannot be registered with the services yet"
            )
    return spec.registrations()


def unlimited_queues(trace_queues: Iterable[str]) -> Queues:
    """Every trace queue unlimited: the services' queue configuration without a queues file."""
    names = sorted(set(trace_queues))
    return queues_of(QueuesFile.model_validate({"queues": [{"name": q, "unlimited": True} for q in names]}))


def request_of(job: TraceJob) -> JobRequested:
    """The trace job as a producer asks for it."""
    shared = job.gpu_milli is not None
    limit = job.time_limit_s
    return JobRequested(
        job_id=job.id,
        queue=job.queue,
        workers=job.workers,
        gpus_per_worker=0 if shared else job.gpus_per_worker,
        gpu_fraction_milli=job.gpu_milli,
        gpu_type=job.gpu_type,
        priority=job.priority,
        preemptible=job.preemptible,
        topology=Topology(level="node") if job.same_node else None,
        duration_hint_s=max(1, math.ceil(job.duration_s)),
        time_limit_s=min(MAX_TIME_LIMIT_S, max(1, math.ceil(limit))) if limit is not None else None,
        min_workers=job.min_workers,
    )


def profile_name(profile_path: Path | None) -> str:
    if profile_path is None:
        return default_profile().name
    return load_profile_file(profile_path, placement_registry()).name


@dataclass(frozen=True, slots=True)
class SimulateOptions:
    """One run's knobs: the services' settings, the nodes', heartbeats, sampling."""

    services: ServiceOptions = field(default_factory=ServiceOptions)
    nodes: NodeOptions = field(default_factory=NodeOptions)
    heartbeats: HeartbeatMode = "when_needed"
    sample_s: float = 300.0


class _ServiceRecorder(Recorder):
    """`gangline simulate`'s recorder, measuring fragmentation on placement's own snapshot."""

    def __init__(self, sim: ServiceSimulation, **kwargs: Any) -> None:
        super().__init__(snapshot=sim.placement.state.snapshot(), **kwargs)
        self._sim = sim

    def _heavy_sample(self, t: float, policy: Any) -> None:
        self.snapshot = self._sim.placement.state.snapshot()
        super()._heavy_sample(t, policy)

    def at_end(self, policy: Any) -> None:
        self.snapshot = self._sim.placement.state.snapshot()
        super().at_end(policy)


class _Measure:
    """Turns what the services decided into the recorder's events (see the module docstring)."""

    def __init__(self, sim: ServiceSimulation, jobs: Sequence[TraceJob], rec: Recorder) -> None:
        self.sim = sim
        self.rec = rec
        self.info: dict[str, TraceJob] = {j.id: j for j in jobs}
        self.core: dict[JobId, Job] = {}
        self.waiting: dict[JobId, None] = {}
        self.live: dict[str, str] = {}
        """Live allocation → its job."""
        self.reclaiming: set[str] = set()
        """Live allocations preemption asked to checkpoint for a reclaim (``preemption_reason``)."""
        self.rejected = 0
        self.cycle = 0
        topics = sim.topics
        self._requests, self._allocations, self._events = topics.requests, topics.allocations, topics.events

    def observe(self, tx: Transaction) -> None:
        t = tx.at
        rec = self.rec
        for topic, envelope in tx.outputs:
            data = envelope.data
            if topic == self._allocations:
                if isinstance(data, AllocationGranted):
                    job = self.info.get(data.job_id)
                    if job is None or data.allocation_id in self.live:
                        continue
                    self.live[data.allocation_id] = data.job_id
                    gpus = job.gpus * data.workers / job.workers
                    if data.resizes is not None:
                        rec.resized(job, t, gpus=gpus)  # an elastic resize: the same run goes on
                        continue
                    self.waiting.pop(job.id, None)
                    rec.started(job, t, gpus=gpus)
                elif isinstance(data, AllocationReleased):
                    job_id = self.live.pop(data.allocation_id, None)
                    if job_id is None:
                        continue
                    job = self.info[job_id]
                    reclaim = data.allocation_id in self.reclaiming
                    self.reclaiming.discard(data.allocation_id)
                    if data.reason == "resized":
                        continue  # the run goes on in the grant that resizes it
                    if data.reason in ("preempted", "node_failed"):
                        lost = self.sim.sim_nodes.lost_s.get(data.allocation_id, 0.0)
                        rec.preempted(job, t, lost_s=lost, reclaim=reclaim)
                        self.waiting[job.id] = None
                    else:
                        rec.finished(job, t)
            elif topic == self._requests and isinstance(data, JobRequested):
                job = self.info.get(data.job_id)
                if job is not None:
                    rec.submitted(job)
                    self.waiting[job.id] = None
            elif topic == self._events and isinstance(data, JobRejected):
                self.rejected += 1
            elif (
                topic == self._events
                and isinstance(data, JobPreempting)
                and preemption_reason(data) == "reclaim"
                and data.allocation_id in self.live
            ):
                self.reclaiming.add(data.allocation_id)

    def step(self) -> None:
        """After each input's cascade: a cycle counted, the state sampled."""
        cycle = self.sim.placement.state.cycle
        for _ in range(cycle - self.cycle):
            self.rec.cycle_done((), ())
        self.cycle = cycle
        self.rec.sample(self.sim.now, self)

    def pending(self) -> Sequence[Job]:
        out = []
        for job_id in self.waiting:
            job = self.core.get(job_id)
            if job is None:
                job = self.core[job_id] = self.info[job_id].to_job()
            out.append(job)
        return out

    def held_gpus(self) -> float:
        return self.rec.running


@dataclass
class ServiceRun:
    """The measured run, the simulation it ran on (every service's state), and what the run counted."""

    result: RunResult
    simulation: ServiceSimulation
    rejected: int


def simulate_services(
    jobs: Sequence[TraceJob],
    spec: ClusterSpec,
    *,
    queues: Queues | Path | None = None,
    profile_path: Path | None = None,
    options: SimulateOptions | None = None,
    failures: Sequence[tuple[float, str]] = (),
    keep_log: bool = False,
    observers: Sequence[Observer] = (),
) -> ServiceRun:
    """Run ``jobs`` on ``spec`` through the services' handlers; the figures of `gangline simulate`.

    ``queues``: the services' queue configuration (or its file); every queue unlimited without one.
    ``profile_path``: placement's (and preemption's) profile; the services' default otherwise.
    ``failures``: (virtual time, node) at which a node goes silent for good.
    ``observers``: also told of every transaction (after the run's own measuring).
    """
    if isinstance(queues, Path):
        queues = load_queues(queues)
    if queues is None:
        queues = unlimited_queues(j.queue for j in jobs)
    return simulate_on(
        jobs,
        registrations(spec),
        queues,
        cluster_name=spec.name,
        profile_path=profile_path,
        options=options,
        failures=failures,
        keep_log=keep_log,
        observers=observers,
        entitlement=entitlement_weights([queues.tree.spec(q) for q in queues.tree.queue_names()], jobs),
    )


def simulate_on(
    jobs: Sequence[TraceJob],
    nodes: Sequence[NodeRegistered],
    queues: Queues,
    *,
    cluster_name: str,
    profile_path: Path | None = None,
    options: SimulateOptions | None = None,
    failures: Sequence[tuple[float, str]] = (),
    keep_log: bool = False,
    entitlement: Mapping[QueueName, float] | None = None,
    observers: Sequence[Observer] = (),
) -> ServiceRun:
    """Run ``jobs`` through the services' handlers on the nodes these registrations describe."""
    wall0 = time.perf_counter()
    opts = options or SimulateOptions()
    services = ServiceOptions(**{**_fields(opts.services), "profile_path": profile_path})
    sim = ServiceSimulation(
        nodes=list(nodes),
        queues=queues,
        cluster_name=cluster_name,
        options=services,
        node_options=opts.nodes,
        heartbeats=opts.heartbeats,
        keep_log=keep_log,
    )
    rec = _ServiceRecorder(
        sim,
        policy=f"services:{profile_name(profile_path)}",
        capacity_gpus=float(sum(len(n.gpus) for n in nodes)),
        sample_s=opts.sample_s,
        entitlement=dict(entitlement or {}),
    )
    measure = _Measure(sim, jobs, rec)
    sim.observers.append(measure.observe)
    sim.observers.extend(observers)
    sim.steps.append(measure.step)
    sim.register_nodes(0.0)
    for job in sorted(jobs, key=lambda j: (j.submit_s, j.id)):
        sim.request(job.submit_s, request_of(job), event_id=derived_id(PRODUCER, job.id, "requested"))
    known = {n.node for n in sim.nodes}
    for at, node in failures:
        if node not in known:
            raise ValueError(f"cannot fail node {node}: the cluster has no such node")
        sim.fail_node(at, node)
    sim.run()
    rec.at_end(measure)
    return ServiceRun(rec.result(time.perf_counter() - wall0), sim, measure.rejected)


def _fields(options: ServiceOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in options.__dataclass_fields__}
