"""Which waiting jobs a cycle needs to see: the rest provably change nothing (pure).

Under contention most waiting jobs cannot fit, and handing them all to the core every cycle costs
a pre-filter each, every release. `WaitingIndex` keeps the waiting jobs in groups of identical
requests (queue, shape, priority: everything placement reads except the job's id and duration)
and, at the start of a cycle, hands over only each group's first `keep` jobs in line order:

* `fit`: how many copies of the shape the free GPUs could hold at most (whole GPUs: per model,
  the workers of `gpus_per_worker` that the free GPUs of each node hold, over the gang size).
  An allocate-only cycle only takes GPUs, so no more copies than that can be placed, and as the
  core is monotone (a request that failed does not fit once GPUs are only taken), the copies it
  places are the first ones in its order; a group is in that order (submit order, or the queue's
  line), so its jobs past `fit` would all fail the pre-filter and leave no trace.
* `admit` (queues only): fair order charges a queue's share for each job its quota would admit,
  whether it fits or not, and that moves later jobs. Quota also only shrinks within a cycle, so of
  a group at most `floor(available / request)` jobs are charged, the first ones in the queue's
  line; a job that is never charged is skipped by fair order, and dropping a skipped job leaves the
  order of the others unchanged. A group keeps `max(fit, admit)` jobs.

Only for profiles that never free GPUs inside a cycle: allocate-only ones (see `CorePolicy`), and
EASY backfill (`EasyBackfill`), whose reservation holds and gives back only GPUs free at the start.
EASY also needs, of each group, the first job left out (`candidates(..., blocked=[])`): the first
waiting job that cannot start is the head that gets the reservation. Its backfill rule reads
the duration hint, so its groups are keyed by `group_key_with_hint`.
Fractional and MIG requests are never dropped (their capacity is not counted here).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import islice

from gangline.core.model import GpuMode, GpuModel, Job, JobId, MiB
from gangline.core.snapshot import Snapshot

FRONT_OF_LINE = 256
"""How many waiting jobs at the front of the line every cycle looks at, placeable now or not (their
reservations and explanations are decided there); the rest only when the free GPUs could hold them."""

GroupKey = tuple[object, ...]
LineKey = tuple[float, str]
"""A job's place in its group's line: (submit order or submit time, id)."""
AdmitLimit = Callable[[Job, int], int]
"""(a job of the group, group size) -> how many of the group quota could admit, at most the size."""


def group_key(job: Job) -> GroupKey:
    """Everything about a job that placement reads, except its id and duration."""
    return (
        job.queue,
        job.priority,
        job.workers,
        job.gpus_per_worker,
        job.gpu_type,
        job.gpu_memory_mib,
        job.mig_profile,
        job.gpu_milli,
        job.preemptible,
        job.checkpoint_grace_s,
        job.topology,
        job.min_workers,
    )


def group_key_with_hint(job: Job) -> GroupKey:
    """`group_key` and the run bound (limit or hint): for rules that read it (EASY backfill)."""
    return (*group_key(job), job.run_bound_s)


class WaitingIndex:
    """Waiting jobs by group, each group in line order (see module docstring)."""

    def __init__(self, key: Callable[[Job], GroupKey] = group_key) -> None:
        self._key = key
        self._groups: dict[GroupKey, list[tuple[LineKey, Job]]] = {}
        self._where: dict[JobId, tuple[GroupKey, LineKey]] = {}
        self._fit_keys: dict[GroupKey, tuple[GpuModel | None, MiB | None, int, int] | tuple[()]] = {}
        """Per group ever seen, its request as `_FitCounter.copies_of` reads it (() when not counted)."""
        self._hints: dict[GroupKey, list[tuple[float, LineKey, Job]]] = {}
        """Per group, its jobs with a duration hint, by (hint, line): for `short_candidates`."""

    def __len__(self) -> int:
        return len(self._where)

    def add(self, job: Job, line: LineKey) -> None:
        """`job` waits; `line` orders it in its group (unique per job)."""
        key = self._key(job)
        group = self._groups.setdefault(key, [])
        entry = (line, job)
        if not group or group[-1][0] < line:
            group.append(entry)
        else:
            insort(group, entry, key=lambda e: e[0])
        self._where[job.id] = (key, line)
        if job.run_bound_s is not None:
            insort(self._hints.setdefault(key, []), (float(job.run_bound_s), line, job), key=_hint_key)

    def line_of(self, job_id: JobId) -> LineKey:
        """The line key `job_id` waits with."""
        return self._where[job_id][1]

    def remove(self, job_id: JobId) -> None:
        """`job_id` no longer waits (placed); unknown ids are ignored."""
        where = self._where.pop(job_id, None)
        if where is None:
            return
        key, line = where
        group = self._groups[key]
        job = group.pop(bisect_left(group, line, key=lambda e: e[0]))[1]
        if not group:
            del self._groups[key]
        if job.run_bound_s is not None:
            hints = self._hints[key]
            del hints[bisect_left(hints, (float(job.run_bound_s), line), key=_hint_key)]
            if not hints:
                del self._hints[key]

    def short_candidates(self, snapshot: Snapshot, horizon: float) -> list[tuple[LineKey, Job]]:
        """Of each group, the first jobs in line with a duration hint of at most `horizon`, as many
        as the free GPUs could hold (`candidates` counts them the same way); unsorted.

        Backfill tries the waiting jobs that end before a reservation starts, in line order within a
        group, and only takes GPUs free at the start of the cycle: no job of a group past these starts.
        """
        fits = _FitCounter(snapshot)
        out: list[tuple[LineKey, Job]] = []
        for hints in self._hints.values():
            n = bisect_right(hints, horizon, key=lambda e: e[0])
            if not n:
                continue
            keep = fits.copies(hints[0][2], n)
            if keep >= n:
                out.extend((e[1], e[2]) for e in islice(hints, n))
            elif keep:
                out.extend((e[1], e[2]) for e in heapq.nsmallest(keep, islice(hints, n), key=_line_key))
        return out

    def candidates(
        self,
        snapshot: Snapshot,
        admit: AdmitLimit | None = None,
        *,
        blocked: list[tuple[LineKey, Job]] | None = None,
        blocked_each: int = 1,
    ) -> list[tuple[LineKey, Job]]:
        """The jobs a cycle on `snapshot` may place or charge, with their line keys (unsorted).

        `blocked`, when given, gets each group's first `blocked_each` jobs left out (they cannot be
        placed now).
        """
        fits = _FitCounter(snapshot)
        out: list[tuple[LineKey, Job]] = []
        fit_keys = self._fit_keys
        for gkey, group in self._groups.items():
            job = group[0][1]
            fkey = fit_keys.get(gkey)
            if fkey is None:
                fkey = fit_keys[gkey] = fit_key(job)
            keep = fits.copies_of(fkey, len(group)) if fkey else len(group)
            if admit is not None and keep < len(group):
                keep = max(keep, admit(job, len(group)))
            if keep >= len(group):
                out.extend(group)
                continue
            out.extend(group[:keep])
            if blocked is not None:
                blocked.extend(group[keep : keep + blocked_each])
        return out


def fit_key(job: Job) -> tuple[GpuModel | None, MiB | None, int, int] | tuple[()]:
    """A request as `_FitCounter.copies_of` counts it: (GPU type, memory, GPUs per worker, fewest
    workers) of a whole-GPU job; () for MIG and fractional ones, which are not counted."""
    if job.kind is GpuMode.WHOLE:
        return (job.gpu_type, job.gpu_memory_mib, job.gpus_per_worker, job.fewest_workers)
    return ()


def _hint_key(e: tuple[float, LineKey] | tuple[float, LineKey, Job]) -> tuple[float, LineKey]:
    return (e[0], e[1])


def _line_key(e: tuple[float, LineKey, Job]) -> LineKey:
    return e[1]


class _FitCounter:
    """How many copies of a request the free GPUs could hold at most; cached per shape."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snap = snapshot
        self._workers: dict[tuple[int, int], int] = {}
        self._copies: dict[tuple[GpuModel | None, MiB | None, int, int], int] = {}

    def _workers_fit(self, m: int, per_worker: int) -> int:
        key = (m, per_worker)
        n = self._workers.get(key)
        if n is None:
            buckets = self.snap.buckets[m]
            n = sum((k // per_worker) * len(b) for k, b in enumerate(buckets) if k >= per_worker and b)
            self._workers[key] = n
        return n

    def copies(self, job: Job, limit: int) -> int:
        """At most this many copies of `job` fit now (`limit` when not counted)."""
        if job.kind is not GpuMode.WHOLE:
            return limit
        key = (job.gpu_type, job.gpu_memory_mib, job.gpus_per_worker, job.fewest_workers)
        return self.copies_of(key, limit)

    def copies_of(self, key: tuple[GpuModel | None, MiB | None, int, int], limit: int) -> int:
        """`copies` of a whole-GPU request by its (GPU type, memory, GPUs per worker, fewest workers)."""
        n = self._copies.get(key)
        if n is None:
            snap = self.snap
            gpu_type, memory, per_worker, fewest = key
            n = 0
            for m, model in enumerate(snap.models):
                if gpu_type is not None and model != gpu_type:
                    continue
                if memory is not None and snap.model_memory[m] < memory:
                    continue
                if snap.capacity[m] and per_worker <= snap.max_per_node:
                    n += self._workers_fit(m, per_worker) // fewest
            self._copies[key] = n
        return min(n, limit)


def line_time(job: Job, submitted: float, short_first_weight: float | None) -> float:
    """When ``job`` stands in placement's line: its submit time, plus ``short_first_weight`` times its
    run bound (duration hint or time limit) when both are given.

    The profile's ``short_first_weight`` (shortest first among jobs submitted together): of a batch
    submitted at once, the short jobs start first, which lowers the batch's mean wait, and as the
    handicap is a job's run time, not its size, a big gang of short jobs is not put behind small long
    ones. A job waiting longer than the others' handicaps is still ahead of them (it is a handicap,
    not a class). A job with no run bound keeps its submit time.
    """
    bound = job.run_bound_s
    if short_first_weight is None or bound is None:
        return submitted
    return submitted + short_first_weight * bound


def waiting_line(
    jobs: Iterable[Job], admitted_at: Mapping[JobId, float], *, short_first_weight: float | None = None
) -> list[Job]:
    """The waiting jobs in the order placement's line keeps them (:func:`cycle_jobs` reads its front):
    highest priority first, then admitted earliest (``admitted_at``, seconds; unknown: last; moved back
    by :func:`line_time` with ``short_first_weight``), then by job id. Every part of it is read from
    the log, so a restore or a replay lines them up alike."""

    def key(job: Job) -> tuple[int, float, str]:
        at = admitted_at.get(job.id)
        return (-job.priority, math.inf if at is None else line_time(job, at, short_first_weight), job.id)

    return sorted(jobs, key=key)


def cycle_jobs(snapshot: Snapshot, line: Sequence[Job], head: int) -> list[Job]:
    """The jobs of ``line`` (in line order) a cycle on ``snapshot`` looks at: no window strands a fit.

    The first ``head`` jobs always (the front of the line: reservations, preemption and explanations
    are about them), and after those every job the free GPUs could hold: of each group of identical
    requests, the first as many copies as fit (see :class:`WaitingIndex`; MIG and fractional requests
    are always kept). A job left out cannot be placed by this cycle's allocate or backfill, as
    neither frees GPUs, so however many blocked gangs are in front, a job that fits idle GPUs is seen.
    """
    if len(line) <= head:
        return list(line)
    # `WaitingIndex.candidates` over the rest, each job keyed by its place in line: built in line
    # order, so each group is in line order as it is filled, with no insertion sort and no hints.
    groups: dict[GroupKey, list[int]] = {}
    for k in range(head, len(line)):
        key = group_key(line[k])
        group = groups.get(key)
        if group is None:
            groups[key] = [k]
        else:
            group.append(k)
    fits = _FitCounter(snapshot)
    kept: list[int] = []
    for group in groups.values():
        fkey = fit_key(line[group[0]])
        keep = fits.copies_of(fkey, len(group)) if fkey else len(group)
        kept.extend(group if keep >= len(group) else group[:keep])
    kept.sort()
    return [*line[:head], *(line[k] for k in kept)]
