"""What a simulation run measured, and the numbers of the report (pure).

Definitions (all times in seconds of virtual time):

* wait = first start - submit; JCT = end - submit; makespan = last end - first submit.
* utilization = GPU-time of running jobs / (GPUs x makespan), each job counted at the GPUs it runs on
  (an elastic job at its workers of the moment: its resizes followed). `allocation` also counts GPUs
  held by pods of jobs that have not started (partial gangs of the pod baseline): held but idle.
* a queue's gpu_hours: the GPU-time its jobs' runs held, counted the same way, for the runs that ended
  (completed, or preempted).
* alloc_while_waiting = the same ratio restricted to the time when at least one job waits.
* fragmentation: free GPU capacity that no waiting job can use one worker of (whole GPUs: a node
  whose free GPUs of a model are fewer than the smallest waiting worker of that model needs; shared
  GPUs: a GPU whose free milli is below the smallest waiting share). Sampled every `sample_s` while
  work waits, averaged over time.
* jain: Jain's index of x_q = GPUs running for queue q / its entitlement, where entitlements are the
  weighted max-min fair split of the cluster by demand (running + waiting GPUs). 1 = every queue
  gets its entitlement. Sampled like fragmentation while work waits; 1.0 when work never waits.
* end_*: the cluster when the last event is done — free GPUs, the part of them no waiting job can
  use (`end_frag_gpus`), and the jobs/GPUs still waiting. With `hold` (jobs never end) this is the
  FGD packing measure: how much of a full cluster fragmentation leaves unallocatable.
* partial_gangs: jobs that ever held GPUs for some but not all of their workers (must be 0 for
  Gangline); partial_gpu_hours: GPU-hours such pods held while their job could not run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gangline.core.model import FULL_GPU_MILLI, GpuMode, GpuModel, Job, JobId, QueueName
from gangline.core.snapshot import Snapshot
from gangline.sim.trace import TraceJob


class _PolicyView(Protocol):
    def pending(self) -> Sequence[Job]: ...

    def held_gpus(self) -> float: ...


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job's outcome (`start`/`end` are None when it never started/ended)."""

    id: JobId
    queue: QueueName
    gpus: float
    submit: float
    start: float | None
    end: float | None
    preemptions: int
    lost_gpu_hours: float
    timed_out: bool = False
    reclaims: int = 0
    """Of ``preemptions``, those by a reclaim (its cohort took back quota it borrowed), not priority."""
    """Stopped at its time limit (the live system's ``job.failed`` code time_limit), not completed."""
    gpu_hours: float = 0.0
    """GPU-time its ended runs held, at the GPUs each ran on (an elastic job's resizes followed)."""

    @property
    def wait(self) -> float | None:
        return None if self.start is None else self.start - self.submit

    @property
    def jct(self) -> float | None:
        return None if self.end is None else self.end - self.submit


@dataclass
class Series:
    """Time series, one point per state change: time, running GPUs, held GPUs, waiting jobs."""

    t: list[float] = field(default_factory=list)
    running: list[float] = field(default_factory=list)
    held: list[float] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)


@dataclass
class RunResult:
    """Everything one policy run produced."""

    policy: str
    capacity_gpus: float
    jobs: list[JobRecord]
    series: Series
    busy_gpu_s: float
    held_gpu_s: float
    waiting_s: float
    busy_while_waiting_gpu_s: float
    frag_gpu_s: float
    free_while_waiting_gpu_s: float
    jain_weighted: float
    jain_time_s: float
    partial_jobs: int
    partial_gpu_s: float
    cycles: int
    problems: list[str]
    sim_wall_s: float
    end_free_gpus: float = 0.0
    end_frag_gpus: float = 0.0
    end_waiting_gpus: float = 0.0


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of sorted `values` (0 when empty)."""
    if not values:
        return 0.0
    k = max(0, min(len(values) - 1, math.ceil(p / 100.0 * len(values)) - 1))
    return values[k]


def jain_index(xs: Sequence[float]) -> float:
    """Jain's fairness index of `xs` (1.0 for an empty or all-zero list)."""
    s = sum(xs)
    sq = sum(x * x for x in xs)
    if not xs or sq == 0:
        return 1.0
    return s * s / (len(xs) * sq)


def max_min_entitlements(
    demand: Mapping[QueueName, float], weights: Mapping[QueueName, float], capacity: float
) -> dict[QueueName, float]:
    """Weighted max-min fair split of `capacity` among queues by `demand` (water-filling)."""
    out: dict[QueueName, float] = {}
    active = sorted((q for q, d in demand.items() if d > 0), key=lambda q: demand[q] / weights.get(q, 1.0))
    left = capacity
    wsum = sum(weights.get(q, 1.0) for q in active)
    for k, q in enumerate(active):
        w = weights.get(q, 1.0)
        share = left * w / wsum if wsum > 0 else 0.0
        give = min(demand[q], share)
        out[q] = give
        left -= give
        wsum -= w
        if k == len(active) - 1 or left <= 0:
            for r in active[k + 1 :]:
                out[r] = 0.0
            break
    return out


Need = tuple[GpuModel | None, GpuMode, int]
"""What one waiting worker needs: its GPU type (None: any), whole or shared, GPUs or milli."""


def worker_need(
    gpu_type: GpuModel | None, kind: GpuMode, gpus_per_worker: int, gpu_milli: int | None
) -> Need:
    """The `Need` of a worker (MIG workers need a slice, which fragmentation does not count)."""
    size = gpu_milli if kind is GpuMode.SHARED and gpu_milli is not None else gpus_per_worker
    return (gpu_type, kind, size)


class WaitingNeeds:
    """How many waiting jobs have each worker `Need`, kept as jobs come and go (for sampling)."""

    def __init__(self) -> None:
        self._count: dict[Need, int] = {}

    def add(self, need: Need, n: int = 1) -> None:
        c = self._count.get(need, 0) + n
        if c:
            self._count[need] = c
        else:
            del self._count[need]

    def needs(self) -> list[Need]:
        """The distinct needs of the jobs waiting now."""
        return list(self._count)


def fragmentation(snapshot: Snapshot, waiting: Sequence[Job]) -> tuple[float, float]:
    """(free GPUs no waiting worker can use, free GPUs), in GPU-equivalents (see module docstring)."""
    needs = {worker_need(j.gpu_type, j.kind, j.gpus_per_worker, j.gpu_milli) for j in waiting}
    return fragmentation_of(snapshot, needs)


def fragmentation_of(snapshot: Snapshot, needs: Iterable[Need]) -> tuple[float, float]:
    """`fragmentation` given the distinct worker needs of the waiting jobs."""
    by_model = fragmentation_by_model(snapshot, needs).values()
    return sum(frag for frag, _ in by_model), sum(free for _, free in by_model)


def fragmentation_by_model(snapshot: Snapshot, needs: Iterable[Need]) -> dict[GpuModel, tuple[float, float]]:
    """`fragmentation_of` per GPU model: model → (free GPUs no waiting worker can use, free GPUs)."""
    snap = snapshot
    n_models = len(snap.models)
    whole_min = [math.inf] * n_models
    share_min = [math.inf] * n_models
    for gpu_type, kind, size in needs:
        models = range(n_models) if gpu_type is None else [snap.model_pos.get(gpu_type, -1)]
        for m in models:
            if m < 0:
                continue
            if kind is GpuMode.WHOLE:
                whole_min[m] = min(whole_min[m], size)
            elif kind is GpuMode.SHARED:
                share_min[m] = min(share_min[m], size)
    out: dict[GpuModel, tuple[float, float]] = {}
    for m in range(n_models):
        frag = 0.0
        free_total = 0.0
        if snap.capacity[m]:
            need = whole_min[m]
            for k, bucket in enumerate(snap.buckets[m]):
                if k and bucket:
                    free_total += k * len(bucket)
                    if k < need:
                        frag += k * len(bucket)
        if snap.shared_nodes[m]:
            need_milli = share_min[m]
            used = snap.g_milli_used
            for i in snap.shared_nodes[m]:
                if snap.node_cordoned[i]:
                    continue
                for g in snap.node_gpus[i]:
                    if (
                        snap.g_model[g] != m
                        or not snap.g_usable[g]
                        or snap.gpus[g].mode is not GpuMode.SHARED
                    ):
                        continue
                    left = FULL_GPU_MILLI - used[g]
                    if left > 0:
                        free_total += left / FULL_GPU_MILLI
                        if left < need_milli:
                            frag += left / FULL_GPU_MILLI
        out[snap.models[m]] = (frag, free_total)
    return out


def _need(job: TraceJob) -> Need:
    kind = GpuMode.SHARED if job.gpu_milli is not None else GpuMode.WHOLE
    return worker_need(job.gpu_type, kind, job.gpus_per_worker, job.gpu_milli)


class Recorder:
    """Collects a run's measurements as the simulator reports them."""

    def __init__(
        self,
        *,
        policy: str,
        capacity_gpus: float,
        snapshot: Snapshot,
        sample_s: float,
        entitlement: Mapping[QueueName, float],
    ) -> None:
        self.policy = policy
        self.capacity = capacity_gpus
        self.snapshot = snapshot
        self.sample_s = sample_s
        self.entitlement = dict(entitlement)
        self.submit: dict[JobId, float] = {}
        self.start: dict[JobId, float] = {}
        self.end: dict[JobId, float] = {}
        self.info: dict[JobId, TraceJob] = {}
        self.preemptions: dict[JobId, int] = {}
        self.reclaims: dict[JobId, int] = {}
        self.lost: dict[JobId, float] = {}
        self.timed_out: set[JobId] = set()
        self.run_gpus: dict[JobId, float] = {}
        """The GPUs each running job runs on now (an elastic job's: its workers of the moment)."""
        self._run_since: dict[JobId, float] = {}
        """Since when each running job runs on ``run_gpus`` (its start, or its latest resize)."""
        self.gpu_s: dict[JobId, float] = {}
        """GPU-seconds of each job's runs, up to their ends or latest resizes."""
        self.waiting = 0
        self.running = 0.0
        self.q_running: dict[QueueName, float] = {}
        self.q_waiting: dict[QueueName, float] = {}
        self.needs = WaitingNeeds()
        self.series = Series()
        self.partial: set[JobId] = set()
        self.problems: list[str] = []
        self.cycles = 0
        self._last_t: float | None = None
        self._last = (0.0, 0.0, 0)
        self._heavy_t: float | None = None
        self._heavy = (0.0, 0.0, 1.0, False)  # frag, free, jain, waiting
        self.busy_gpu_s = 0.0
        self.held_gpu_s = 0.0
        self.waiting_s = 0.0
        self.busy_ww = 0.0
        self.frag_gpu_s = 0.0
        self.free_ww = 0.0
        self.jain_w = 0.0
        self.jain_t = 0.0
        self.end_frag = 0.0
        self.end_free = 0.0
        self.end_waiting_gpus = 0.0

    # ------------------------------------------------------------ events

    def submitted(self, job: TraceJob) -> None:
        self.info[job.id] = job
        self.submit.setdefault(job.id, job.submit_s)
        self.waiting += 1
        self.q_waiting[job.queue] = self.q_waiting.get(job.queue, 0.0) + job.gpus
        self.needs.add(_need(job))

    def started(self, job: TraceJob, t: float, *, gpus: float | None = None) -> None:
        """The job started on ``gpus`` (None: all it asks for; an elastic job may start on fewer)."""
        self.start.setdefault(job.id, t)
        self.waiting -= 1
        self.q_waiting[job.queue] -= job.gpus
        self.needs.add(_need(job), -1)
        self._run_on(job, t, job.gpus if gpus is None else gpus)

    def resized(self, job: TraceJob, t: float, *, gpus: float) -> None:
        """A running elastic job goes on on ``gpus`` from ``t`` (a shrink or a grow)."""
        self._run_on(job, t, gpus)

    def _run_on(self, job: TraceJob, t: float, gpus: float) -> None:
        before = self._stop(job, t)
        self.run_gpus[job.id] = gpus
        self._run_since[job.id] = t
        self.running += gpus - before
        self.q_running[job.queue] = self.q_running.get(job.queue, 0.0) + gpus - before

    def _stop(self, job: TraceJob, t: float) -> float:
        """Account the job's run up to ``t``; the GPUs it ran on (0: it was not running)."""
        gpus = self.run_gpus.pop(job.id, 0.0)
        since = self._run_since.pop(job.id, None)
        if since is not None:
            self.gpu_s[job.id] = self.gpu_s.get(job.id, 0.0) + gpus * (t - since)
        return gpus

    def finished(self, job: TraceJob, t: float, *, timed_out: bool = False) -> None:
        self.end[job.id] = t
        if timed_out:
            self.timed_out.add(job.id)
        gpus = self._stop(job, t)
        self.running -= gpus
        self.q_running[job.queue] -= gpus

    def preempted(self, job: TraceJob, t: float, *, lost_s: float, reclaim: bool = False) -> None:
        """``job`` was stopped and waits again; ``reclaim``: by a reclaim of borrowed quota."""
        self.preemptions[job.id] = self.preemptions.get(job.id, 0) + 1
        if reclaim:
            self.reclaims[job.id] = self.reclaims.get(job.id, 0) + 1
        gpus = self._stop(job, t)
        self.lost[job.id] = self.lost.get(job.id, 0.0) + lost_s * gpus / 3600.0
        self.running -= gpus
        self.q_running[job.queue] -= gpus
        self.waiting += 1
        self.q_waiting[job.queue] += job.gpus
        self.needs.add(_need(job))

    def cycle_done(self, partial: Sequence[JobId], problems: Sequence[str]) -> None:
        self.cycles += 1
        self.partial.update(partial)
        self.problems.extend(problems)

    def at_end(self, policy: _PolicyView) -> None:
        """The cluster as the last event left it: free GPUs, and those no waiting job can use."""
        waiting = policy.pending()
        frag, self.end_free = fragmentation(self.snapshot, waiting)
        self.end_frag = frag if waiting else 0.0  # nothing waits: no free GPU is stranded
        self.end_waiting_gpus = sum(self.info[j.id].gpus for j in waiting if j.id in self.info)

    # ------------------------------------------------------------ time series

    def sample(self, t: float, policy: _PolicyView) -> None:
        """Account the state since the last sample, then note the state now."""
        if self._last_t is not None:
            dt = t - self._last_t
            running, held, waiting = self._last
            self.busy_gpu_s += running * dt
            self.held_gpu_s += held * dt
            if waiting:
                self.waiting_s += dt
                self.busy_ww += running * dt
        held_now = policy.held_gpus()
        state = (self.running, held_now, self.waiting)
        if state != self._last or self._last_t is None:
            s = self.series
            s.t.append(t)
            s.running.append(self.running)
            s.held.append(held_now)
            s.waiting.append(self.waiting)
        self._last_t = t
        self._last = state
        if self._heavy_t is None or t - self._heavy_t >= self.sample_s:
            self._heavy_sample(t, policy)

    def _heavy_sample(self, t: float, policy: _PolicyView) -> None:
        if self._heavy_t is not None:
            dt = t - self._heavy_t
            frag, free, jain, waiting = self._heavy
            if waiting:
                self.frag_gpu_s += frag * dt
                self.free_ww += free * dt
                self.jain_w += jain * dt
                self.jain_t += dt
        self._heavy_t = t
        if not self.waiting:
            self._heavy = (0.0, 0.0, 1.0, False)
            return
        frag, free = fragmentation_of(self.snapshot, self.needs.needs())
        demand = {
            q: self.q_running.get(q, 0.0) + self.q_waiting.get(q, 0.0)
            for q in set(self.q_running) | set(self.q_waiting)
        }
        ent = max_min_entitlements(demand, self.entitlement, self.capacity)
        xs = [self.q_running.get(q, 0.0) / e for q, e in ent.items() if e > 1e-9]
        self._heavy = (frag, free, jain_index(xs), True)

    # ------------------------------------------------------------ result

    def result(self, wall_s: float) -> RunResult:
        """The run's records; call once, after the last event."""
        jobs = [
            JobRecord(
                id=jid,
                queue=j.queue,
                gpus=j.gpus,
                submit=self.submit[jid],
                start=self.start.get(jid),
                end=self.end.get(jid),
                preemptions=self.preemptions.get(jid, 0),
                reclaims=self.reclaims.get(jid, 0),
                lost_gpu_hours=self.lost.get(jid, 0.0),
                timed_out=jid in self.timed_out,
                gpu_hours=self.gpu_s.get(jid, 0.0) / 3600.0,
            )
            for jid, j in self.info.items()
        ]
        partial_s = self.held_gpu_s - self.busy_gpu_s
        return RunResult(
            policy=self.policy,
            capacity_gpus=self.capacity,
            jobs=jobs,
            series=self.series,
            busy_gpu_s=self.busy_gpu_s,
            held_gpu_s=self.held_gpu_s,
            waiting_s=self.waiting_s,
            busy_while_waiting_gpu_s=self.busy_ww,
            frag_gpu_s=self.frag_gpu_s,
            free_while_waiting_gpu_s=self.free_ww,
            jain_weighted=self.jain_w,
            jain_time_s=self.jain_t,
            partial_jobs=len(self.partial),
            partial_gpu_s=max(0.0, partial_s),
            cycles=self.cycles,
            problems=self.problems,
            sim_wall_s=wall_s,
            end_free_gpus=self.end_free,
            end_frag_gpus=self.end_frag,
            end_waiting_gpus=self.end_waiting_gpus,
        )


def _stats(values: list[float]) -> dict[str, float]:
    values.sort()
    mean = sum(values) / len(values) if values else 0.0
    return {"mean": mean, "p50": percentile(values, 50), "p99": percentile(values, 99)}


def summarize(r: RunResult) -> dict[str, object]:
    """The report entry of one run (see module docstring for the definitions)."""
    done = [j for j in r.jobs if j.end is not None]
    started = [j for j in r.jobs if j.start is not None]
    waits = [j.wait for j in started if j.wait is not None]
    jcts = [j.jct for j in done if j.jct is not None]
    w, c = _stats(waits), _stats(jcts)
    first = min((j.submit for j in r.jobs), default=0.0)
    last = max((j.end for j in done if j.end is not None), default=first)
    makespan = last - first
    denom = r.capacity_gpus * makespan
    per_queue: dict[str, dict[str, float]] = {}
    for q in sorted({j.queue for j in r.jobs}):
        qs = [j for j in r.jobs if j.queue == q]
        qw = _stats([j.wait for j in qs if j.wait is not None])
        qc = _stats([j.jct for j in qs if j.jct is not None])
        per_queue[q] = {
            "jobs": len(qs),
            "mean_wait_s": qw["mean"],
            "p50_wait_s": qw["p50"],
            "p99_wait_s": qw["p99"],
            "mean_jct_s": qc["mean"],
            "p50_jct_s": qc["p50"],
            "p99_jct_s": qc["p99"],
            "gpu_hours": sum(j.gpu_hours for j in qs),
            "preemptions": sum(j.preemptions for j in qs),
            "reclaims": sum(j.reclaims for j in qs),
        }
    return {
        "policy": r.policy,
        "jobs": len(r.jobs),
        "completed": len(done),
        "unfinished": len(r.jobs) - len(done),
        "mean_wait_s": w["mean"],
        "p50_wait_s": w["p50"],
        "p99_wait_s": w["p99"],
        "max_wait_s": max(waits, default=0.0),
        "mean_jct_s": c["mean"],
        "p50_jct_s": c["p50"],
        "p99_jct_s": c["p99"],
        "makespan_s": makespan,
        "utilization": r.busy_gpu_s / denom if denom > 0 else 0.0,
        "allocation": r.held_gpu_s / denom if denom > 0 else 0.0,
        "alloc_while_waiting": (
            r.busy_while_waiting_gpu_s / (r.capacity_gpus * r.waiting_s) if r.waiting_s > 0 else None
        ),
        "waiting_time_s": r.waiting_s,
        "frag_gpus_mean": r.frag_gpu_s / r.jain_time_s if r.jain_time_s > 0 else 0.0,
        "frag_share_of_free": r.frag_gpu_s / r.free_while_waiting_gpu_s
        if r.free_while_waiting_gpu_s > 0
        else 0.0,
        "jain": r.jain_weighted / r.jain_time_s if r.jain_time_s > 0 else 1.0,
        "preemptions": sum(j.preemptions for j in r.jobs),
        "reclaims": sum(j.reclaims for j in r.jobs),
        "lost_gpu_hours": sum(j.lost_gpu_hours for j in r.jobs),
        "partial_gangs": r.partial_jobs,
        "partial_gpu_hours": r.partial_gpu_s / 3600.0,
        "end_free_gpus": r.end_free_gpus,
        "end_frag_gpus": r.end_frag_gpus,
        "end_waiting_jobs": len(r.jobs) - len(started),
        "end_waiting_gpus": r.end_waiting_gpus,
        "cycles": r.cycles,
        "problems": len(r.problems),
        "sim_wall_s": r.sim_wall_s,
        "per_queue": per_queue,
    }
