"""The discrete-event simulator: a trace, a cluster and a policy, on a virtual clock (pure).

Events are arrivals (the trace's submit times) and completions (start + remaining run time). All
events at one instant form one batch: completions first (their GPUs are freed), then arrivals,
then one scheduling cycle if any job waits. With `cycle_s` > 0, instants are rounded up to the
next multiple of `cycle_s` (a periodic scheduler: fewer, bigger cycles; completion times stay exact).
A cycle runs only when something changed since the last one and a job waits; when only arrivals
changed, the policy is told which (see `Policy.cycle`) and a monotone one tries only those, so a
saturated stretch of the trace costs one cycle per release, not one per arrival over every waiter.

A job whose trace gives a time limit runs at most that long per start, as the agent enforces it: a
run the limit cuts short ends there (recorded ``timed_out``, like ``job.failed`` code time_limit) and
is not run again.

Preempted jobs return to the queue with the work since their last checkpoint lost (checkpoints
every `checkpoint_s` of run time); a cycle that evicted is followed by another at the same instant,
so the jobs they were preempted for start on the GPUs they freed (and so after an elastic resize).
A policy with elastic jobs that may grow (``may_grow()``) is cycled after a release even when nothing
waits; a running elastic job's GPUs are read from the policy's snapshot at each instant, so the
measures follow its resizes. The run ends when no event is
left; jobs still waiting then (bigger than the cluster, or deadlocked pods) are reported as
unfinished.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gangline.core.model import JobId, QueueName
from gangline.sim.clock import VirtualClock
from gangline.sim.metrics import Recorder, RunResult
from gangline.sim.policies import Policy
from gangline.sim.trace import TraceJob

MAX_FOLLOW_UP_CYCLES = 8
"""Cycles run at one instant after one that evicted (a preemption frees GPUs for its preemptor)."""

Progress = Callable[[int, int, float], None]
"""Called now and then with (jobs finished, jobs in the trace, virtual time)."""


@dataclass(frozen=True, slots=True)
class SimOptions:
    """Knobs of one simulation run."""

    cycle_s: float = 0.0
    """0: a cycle at every event instant; > 0: at most one cycle per `cycle_s` of virtual time."""
    checkpoint_s: float = 1800.0
    """Run time between checkpoints; a preempted job loses the work since its last one."""
    sample_s: float = 300.0
    """Virtual seconds between fairness and fragmentation samples (they cost a pass over the cluster)."""
    hold: bool = False
    """Packing experiment (as in FGD, ATC'23): started jobs never end, so the cluster fills up."""
    entitlement: dict[QueueName, float] = field(default_factory=dict)
    """Weight of each queue's entitlement for Jain's index (by default: equal)."""


@dataclass(slots=True)
class _Live:
    job: TraceJob
    remaining: float
    started_at: float = -1.0
    epoch: int = 0
    cut: bool = False
    """The current run ends at the job's time limit, before its work is done."""


def running_gpus(policy: Policy, job: TraceJob) -> float:
    """The GPUs ``job`` runs on now: all it asks for, or an elastic job's workers of the moment."""
    running = policy.snapshot.running.get(job.id) if job.min_workers is not None else None
    if running is None:
        return job.gpus
    return job.gpus * len(running.allocation.placements) / job.workers


def _may_grow(policy: Policy) -> bool:
    """Whether a release is worth a cycle with nothing waiting: a policy that grows elastic jobs says so."""
    grows = getattr(policy, "may_grow", None)
    return bool(grows()) if grows is not None else False


class Simulator:
    """Run `policy` over `jobs` (see module docstring)."""

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        policy: Policy,
        capacity_gpus: float,
        options: SimOptions | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.jobs = list(jobs)
        self.policy = policy
        self.options = options or SimOptions()
        self.clock = VirtualClock()
        self.progress = progress
        self.recorder = Recorder(
            policy=policy.name,
            capacity_gpus=capacity_gpus,
            snapshot=policy.snapshot,
            sample_s=self.options.sample_s,
            entitlement=self.options.entitlement,
        )

    def run(self) -> RunResult:
        """Simulate to the end; the per-job records and the time series."""
        wall0 = time.perf_counter()
        opts, policy, rec, clock = self.options, self.policy, self.recorder, self.clock
        arrivals = sorted(self.jobs, key=lambda j: (j.submit_s, j.id))
        live: dict[JobId, _Live] = {}
        elastic: dict[JobId, None] = {}
        """Running elastic jobs: their GPUs are looked up again at each instant (a resize)."""
        core_jobs = {j.id: j.to_job() for j in arrivals}
        completions: list[tuple[float, int, JobId, int]] = []
        seq = 0
        nxt = 0
        total = len(arrivals)
        finished = 0
        q = opts.cycle_s
        while nxt < total or completions:
            t = math.inf
            if nxt < total:
                t = arrivals[nxt].submit_s
            if completions and completions[0][0] < t:
                t = completions[0][0]
            if q > 0:
                t = math.ceil(t / q) * q
            clock.advance_to(t)
            released = False
            while completions and completions[0][0] <= t:
                end, _, jid, epoch = heapq.heappop(completions)
                lv = live[jid]
                if lv.epoch != epoch:
                    continue  # preempted since; this completion is stale
                policy.finish(jid, t)
                rec.finished(lv.job, end, timed_out=lv.cut)
                del live[jid]
                elastic.pop(jid, None)
                finished += 1
                released = True
            arrived: list[JobId] = []
            while nxt < total and arrivals[nxt].submit_s <= t:
                j = arrivals[nxt]
                nxt += 1
                live[j.id] = _Live(j, j.duration_s)
                policy.submit(core_jobs[j.id], t)
                rec.submitted(j)
                arrived.append(j.id)
            follow_ups = 0
            while (arrived or released) and (rec.waiting or _may_grow(policy)):
                out = policy.cycle(t, None if released else arrived)
                reclaimed = set(out.reclaimed)
                for jid in out.evicted:
                    lv = live[jid]
                    ran = t - lv.started_at
                    kept = (
                        math.floor(ran / opts.checkpoint_s) * opts.checkpoint_s
                        if opts.checkpoint_s > 0
                        else 0
                    )
                    lv.remaining = max(1.0, lv.remaining - kept)
                    lv.epoch += 1
                    rec.preempted(lv.job, t, lost_s=ran - kept, reclaim=jid in reclaimed)
                    elastic.pop(jid, None)
                for jid in out.started:
                    lv = live[jid]
                    lv.started_at = t
                    rec.started(lv.job, t, gpus=running_gpus(policy, lv.job))
                    if lv.job.min_workers is not None:
                        elastic[jid] = None
                    if not opts.hold:
                        seq += 1
                        run_s, limit = lv.remaining, lv.job.time_limit_s
                        lv.cut = limit is not None and limit < run_s
                        if lv.cut and limit is not None:
                            run_s = limit
                        heapq.heappush(completions, (t + run_s, seq, jid, lv.epoch))
                rec.cycle_done(out.partial, out.problems)
                # Evicted jobs' GPUs are free now: the jobs they were preempted for take them at
                # once, in another cycle at this instant (a few at most, so preemption cannot loop).
                arrived, released = [], bool(out.evicted or out.resized)
                follow_ups += 1
                if follow_ups > MAX_FOLLOW_UP_CYCLES:
                    break
            for jid in elastic:  # resized in a cycle, or grown as a release was taken
                gpus = running_gpus(policy, live[jid].job)
                if gpus != rec.run_gpus.get(jid):
                    rec.resized(live[jid].job, t, gpus=gpus)
            rec.sample(t, policy)
            if self.progress is not None and (finished & 1023) == 0:
                self.progress(finished, total, t)
        rec.at_end(policy)
        if self.progress is not None:
            self.progress(finished, total, clock.now)
        return rec.result(time.perf_counter() - wall0)
