"""The analytics figures as pure folds (no faust, no Kafka, no clock): events in, measures out.

Two stages, as the stream runs them (``wiring.py``):

1. :func:`fold_job` folds one job's events (``allocations.log`` and ``jobs.events``, keyed by job id,
   read in any order between the two topics) into a small :class:`JobFacts` and says which
   :class:`Measure` s the new event completed: the GPU-seconds of an ended allocation cut at hour
   boundaries, the wait before each grant, a preemption and the GPU-seconds it lost, the job's final
   state. Each measure has an id derived from the job's facts and is emitted once: the facts
   remember what they emitted, so an event read twice emits nothing the second time.
2. The measures, keyed by ``queue|gpu_model``, are summed into windowed tables; :func:`percentiles`
   reads a wait histogram (:data:`WAIT_BUCKETS_S`) back as quantiles.

The GPU model of a measure is the allocation's (``allocation.granted``'s ``gpu_type``), else the model
quota charged the attempt to (``job.queued``), else the job's own ``gpu_type``, else ``any``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from gangline.events import allocations, jobs
from gangline.events.base import Envelope

HOUR_S = 3600
DAY_S = 86_400
ANY_MODEL = "any"
UNKNOWN_QUEUE = "unknown"
"""The queue of a job rejected before anyone read its spec (jobs.events alone does not name it)."""

FinalState = Literal["completed", "failed", "cancelled", "rejected"]
MeasureKind = Literal["gpu_seconds", "wait", "preemption", "final"]

WAIT_BUCKETS_S: tuple[float, ...] = (
    1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14_400, 28_800, 86_400, 259_200, math.inf,
)  # fmt: skip
"""Upper bounds of the wait histogram's buckets, in seconds (the last is +Inf), as Prometheus'd have them."""


def series_key(queue: str, gpu_model: str) -> str:
    """The key of a figure series: ``queue|gpu_model`` (queue names hold no ``|``)."""
    return f"{queue}|{gpu_model}"


def split_series_key(key: str) -> tuple[str, str]:
    queue, _, model = key.partition("|")
    return queue, model


@dataclass(frozen=True, slots=True)
class Measure:
    """One contribution to the figures of ``queue`` x ``gpu_model`` at ``at`` (epoch seconds).

    ``value``: GPU-seconds (gpu_seconds: inside the hour starting at ``at``; preemption: lost), or the
    wait in seconds; 0 for a final state. ``state`` is the final state of a ``final`` measure.
    """

    id: str
    kind: MeasureKind
    queue: str
    gpu_model: str
    at: float
    value: float = 0.0
    state: str | None = None

    @property
    def key(self) -> str:
        return series_key(self.queue, self.gpu_model)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "queue": self.queue,
            "gpu_model": self.gpu_model,
            "at": self.at,
            "value": self.value,
            "state": self.state,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Measure:
        return cls(
            id=str(data["id"]),
            kind=data["kind"],
            queue=str(data["queue"]),
            gpu_model=str(data["gpu_model"]),
            at=float(data["at"]),
            value=float(data["value"]),
            state=data.get("state"),
        )


@dataclass(frozen=True, slots=True)
class Grant:
    allocation_id: str
    granted_at: float
    gpus: float
    """GPUs held (:attr:`AllocationGranted.gpu_share`)."""
    gpu_model: str | None
    released_at: float | None = None
    reason: str | None = None
    resizes: str | None = None
    """The allocation this grant replaces at another size (an elastic resize: no wait of its own)."""


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the figures need to know about one job (JSON-able: :meth:`to_json` / :meth:`from_json`)."""

    queue: str | None = None
    spec_model: str | None = None
    charged_model: str | None = None
    waits_from: tuple[float, ...] = ()
    """When each attempt began to wait: admitted, then each requeue."""
    grants: tuple[Grant, ...] = ()
    preempted: tuple[tuple[str, float, float], ...] = ()
    """(allocation id, time, lost GPU-seconds) of each job.preempted."""
    final: tuple[str, float, str | None] | None = None
    """(state, time, the allocation it ended) once the job ended."""
    emitted: frozenset[str] = field(default_factory=frozenset)

    def to_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "spec_model": self.spec_model,
            "charged_model": self.charged_model,
            "waits_from": list(self.waits_from),
            "grants": [
                [g.allocation_id, g.granted_at, g.gpus, g.gpu_model, g.released_at, g.reason, g.resizes]
                for g in self.grants
            ],
            "preempted": [list(p) for p in self.preempted],
            "final": list(self.final) if self.final is not None else None,
            "emitted": sorted(self.emitted),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobFacts:
        final = data.get("final")
        return cls(
            queue=data.get("queue"),
            spec_model=data.get("spec_model"),
            charged_model=data.get("charged_model"),
            waits_from=tuple(float(t) for t in data.get("waits_from", ())),
            grants=tuple(
                Grant(str(a), float(t), float(n), m, None if r is None else float(r), why, *rest[:1])
                for a, t, n, m, r, why, *rest in data.get("grants", ())
            ),
            preempted=tuple((str(a), float(t), float(v)) for a, t, v in data.get("preempted", ())),
            final=None if final is None else (str(final[0]), float(final[1]), final[2]),
            emitted=frozenset(data.get("emitted", ())),
        )

    @property
    def live(self) -> tuple[Grant, ...]:
        """Allocations granted and not yet released."""
        return tuple(g for g in self.grants if g.released_at is None)

    def model_of(self, grant: Grant | None = None) -> str:
        if grant is not None and grant.gpu_model:
            return grant.gpu_model
        return self.charged_model or self.spec_model or ANY_MODEL


def hour_pieces(start: float, end: float) -> list[tuple[float, float]]:
    """``[start, end)`` cut at UTC hour boundaries: (hour start, seconds inside that hour) per hour."""
    pieces: list[tuple[float, float]] = []
    t = start
    while t < end:
        hour = math.floor(t / HOUR_S) * HOUR_S
        upto = min(end, hour + HOUR_S)
        pieces.append((float(hour), upto - t))
        t = upto
    return pieces


def _ts(time: datetime) -> float:
    return time.timestamp()


def fold_job(job_id: str, facts: JobFacts | None, envelope: Envelope) -> tuple[JobFacts, list[Measure]]:
    """The job's facts after ``envelope`` and the measures that became complete with it (each once)."""
    facts = _apply(facts or JobFacts(), envelope)
    fresh = [m for m in _measures(job_id, facts) if m.id not in facts.emitted]
    if fresh:
        facts = replace(facts, emitted=facts.emitted | {m.id for m in fresh})
    return facts, fresh


def _apply(facts: JobFacts, envelope: Envelope) -> JobFacts:
    data, at = envelope.data, _ts(envelope.time)
    if isinstance(data, jobs.JobAdmitted):
        return replace(
            facts,
            queue=facts.queue or data.spec.queue,
            spec_model=data.spec.gpu_type,
            waits_from=tuple(sorted({*facts.waits_from, at})),
        )
    if isinstance(data, jobs.JobRequeued):
        return replace(facts, waits_from=tuple(sorted({*facts.waits_from, at})))
    if isinstance(data, jobs.JobQueued):
        return replace(
            facts, queue=facts.queue or data.queue, charged_model=data.gpu_type or facts.charged_model
        )
    if isinstance(data, allocations.AllocationGranted):
        if any(g.allocation_id == data.allocation_id and not _early(g) for g in facts.grants):
            return facts
        grant = Grant(data.allocation_id, at, data.gpu_share, data.gpu_type, resizes=data.resizes)
        grants = _merge_early_releases((*facts.grants, grant))
        return replace(facts, queue=facts.queue or data.queue, grants=grants)
    if isinstance(data, allocations.AllocationReleased):
        grants = tuple(
            replace(g, released_at=at, reason=data.reason)
            if g.allocation_id == data.allocation_id and g.released_at is None
            else g
            for g in facts.grants
        )
        known = any(g.allocation_id == data.allocation_id for g in grants)
        if not known:  # the release was read before its grant: keep it until the grant comes
            grants = (*grants, Grant(data.allocation_id, _NOT_YET, 0.0, None, at, data.reason))
        return replace(facts, grants=_merge_early_releases(grants))
    if isinstance(data, jobs.JobPreempted):
        if any(p[0] == data.allocation_id for p in facts.preempted):
            return facts
        return replace(
            facts, preempted=(*facts.preempted, (data.allocation_id, at, float(data.lost_gpu_seconds)))
        )
    final = _final_state(data)
    if final is not None and facts.final is None:
        return replace(facts, final=(final, at, getattr(data, "allocation_id", None)))
    return facts


_NOT_YET = -1.0


def _early(grant: Grant) -> bool:
    """A release read before its grant: a placeholder without a grant time."""
    return grant.granted_at == _NOT_YET


def _merge_early_releases(grants: Iterable[Grant]) -> tuple[Grant, ...]:
    """The grants in grant order (placeholders last), each placeholder merged into its grant once read."""
    kept: dict[str, Grant] = {}
    for g in grants:
        seen = kept.get(g.allocation_id)
        if seen is None:
            kept[g.allocation_id] = g
        elif _early(seen) and not _early(g):
            kept[g.allocation_id] = replace(g, released_at=seen.released_at, reason=seen.reason)
        elif _early(g) and not _early(seen):
            kept[g.allocation_id] = replace(seen, released_at=g.released_at, reason=g.reason)
    return tuple(sorted(kept.values(), key=lambda g: (_early(g), 0.0 if _early(g) else g.granted_at)))


def _final_state(data: object) -> FinalState | None:
    if isinstance(data, jobs.JobCompleted):
        return "completed"
    if isinstance(data, jobs.JobFailed):
        return "cancelled" if data.code.startswith("cancel") else "failed"
    if isinstance(data, jobs.JobRejected):
        return "rejected"
    return None


def _measures(job_id: str, facts: JobFacts) -> list[Measure]:
    queue = facts.queue
    out: list[Measure] = []
    if queue is None:  # nothing can be attributed yet, except a rejection that will never name one
        if facts.final is not None and facts.final[0] == "rejected":
            out.append(_final(job_id, UNKNOWN_QUEUE, ANY_MODEL, facts.final))
        return out
    granted = [g for g in facts.grants if not _early(g)]
    runs = 0
    for grant in granted:
        model = facts.model_of(grant)
        if grant.released_at is not None:
            for hour, seconds in hour_pieces(grant.granted_at, grant.released_at):
                out.append(
                    Measure(
                        f"{job_id}/{grant.allocation_id}/h{int(hour)}",
                        "gpu_seconds",
                        queue,
                        model,
                        hour,
                        seconds * grant.gpus,
                    )
                )
        if grant.resizes is not None:
            continue  # an elastic resize: the same run at another size, no wait of its own
        # Run k waited since the k-th wait start; read out of order, wait until that start is known.
        index, runs = runs, runs + 1
        starts = [t for t in facts.waits_from if t <= grant.granted_at]
        if len(starts) > index:
            out.append(
                Measure(
                    f"{job_id}/{grant.allocation_id}/wait",
                    "wait",
                    queue,
                    model,
                    grant.granted_at,
                    grant.granted_at - starts[-1],
                )
            )
    models = {g.allocation_id: facts.model_of(g) for g in granted}
    for allocation_id, at, lost in facts.preempted:
        if allocation_id in models:
            out.append(
                Measure(
                    f"{job_id}/{allocation_id}/preempted",
                    "preemption",
                    queue,
                    models[allocation_id],
                    at,
                    lost,
                )
            )
    if facts.final is not None:
        ended = facts.final[2]
        last = next((g for g in granted if g.allocation_id == ended), None)
        if ended is None or last is not None:  # the end names an allocation: counted with its model
            out.append(
                _final(job_id, queue, facts.model_of(last or (granted[-1] if granted else None)), facts.final)
            )
    return out


def _final(job_id: str, queue: str, model: str, final: tuple[str, float, str | None]) -> Measure:
    return Measure(f"{job_id}/final", "final", queue, model, final[1], state=final[0])


# -- the windowed figures -----------------------------------------------------------------------------


def empty_histogram() -> list[int]:
    return [0] * len(WAIT_BUCKETS_S)


def add_to_histogram(counts: Sequence[int], seconds: float) -> list[int]:
    """``counts`` with one more wait of ``seconds`` (in the first bucket whose bound is >= it)."""
    out = list(counts) if len(counts) == len(WAIT_BUCKETS_S) else empty_histogram()
    for i, bound in enumerate(WAIT_BUCKETS_S):
        if seconds <= bound:
            out[i] += 1
            break
    return out


def percentiles(counts: Sequence[int], qs: Sequence[float] = (0.5, 0.9, 0.99)) -> dict[str, float | None]:
    """Quantiles of a wait histogram, interpolated linearly inside a bucket (as ``histogram_quantile``);
    a quantile in the +Inf bucket reads as the last finite bound. None without waits."""
    total = sum(counts)
    out: dict[str, float | None] = {}
    for q in qs:
        name = f"p{round(q * 100):d}"
        if total == 0:
            out[name] = None
            continue
        rank, seen, lower = q * total, 0, 0.0
        for bound, count in zip(WAIT_BUCKETS_S, counts, strict=True):
            if count and seen + count >= rank:
                if math.isinf(bound):
                    out[name] = lower
                else:
                    out[name] = lower + (bound - lower) * (rank - seen) / count
                break
            seen += count
            lower = bound if not math.isinf(bound) else lower
    return out


def add_final(counts: Mapping[str, int], state: str) -> dict[str, int]:
    out = dict(counts)
    out[state] = out.get(state, 0) + 1
    return out


def add_preemption(figures: Sequence[float], lost_gpu_seconds: float) -> list[float]:
    """[preemptions, GPU-seconds lost] with one more preemption."""
    count, lost = (figures[0], figures[1]) if len(figures) == 2 else (0.0, 0.0)
    return [count + 1, lost + lost_gpu_seconds]


def add_histograms(a: Sequence[int], b: Sequence[int]) -> list[int]:
    return [x + y for x, y in zip(a, b, strict=True)]


def add_pairs(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [x + y for x, y in zip(a, b, strict=True)]


def add_counts(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in sorted({*a, *b})}
