"""Weighted fair share: DRF dominant share over GPU types, with usage decayed by a half-life.

A queue's *usage* of a resource is the mean of two numbers, both in GPUs:

- what it holds right now (its running allocation, plus anything admitted earlier in this cycle), and
- its *decayed usage*: the exponentially weighted average of its past allocation, where an hour of
  usage counts half as much after ``half_life_s`` seconds. A queue that held 10 GPUs forever has a
  decayed usage of 10; one that stopped an half-life ago has 5.

Its *dominant share* is the largest, over resources, of usage / cluster capacity, divided by the
queue's weight. With a half-life of 0 the history is just the present, and this is plain DRF.

The order of pending work (:class:`FairOrder`) is priority first, then the dominant share of the
job's queue (recomputed as the cycle admits work), then submit time, then job id.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gangline.core.model import Job
from gangline.core.queues import QueueName, Resource, ResourceVector

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class UsageHistory:
    """Decayed usage per queue and resource, in GPUs, as of ``as_of`` (seconds on the injected clock)."""

    as_of: float
    decayed: Mapping[QueueName, Mapping[Resource, float]] = field(default_factory=dict)

    def of(self, queue: QueueName) -> Mapping[Resource, float]:
        return self.decayed.get(queue, {})


def decay_factor(elapsed_s: float, half_life_s: float) -> float:
    """The weight left on the past after ``elapsed_s``: 1/2 per half-life; 0 when there is no half-life."""
    if half_life_s <= 0:
        return 0.0
    return float(0.5 ** (max(0.0, elapsed_s) / half_life_s))


def advance(
    history: UsageHistory,
    allocation: Mapping[QueueName, ResourceVector],
    *,
    now: float,
    half_life_s: float,
) -> UsageHistory:
    """Move the history to ``now``, given that each queue held ``allocation`` since ``history.as_of``.

    Exact for a constant allocation over the interval, so calling it at every change (or every
    cycle) integrates the usage without error. Values below 1e-9 GPU are dropped.
    """
    if now < history.as_of:
        raise ValueError(f"usage history is at {history.as_of}; cannot move back to {now}")
    keep = decay_factor(now - history.as_of, half_life_s)
    queues = set(history.decayed) | set(allocation)
    out: dict[QueueName, dict[Resource, float]] = {}
    for q in sorted(queues):
        old = history.decayed.get(q, {})
        alloc = allocation.get(q, {})
        vec: dict[Resource, float] = {}
        for r in sorted(set(old) | set(alloc)):
            v = old.get(r, 0.0) * keep + alloc.get(r, 0) * (1.0 - keep)
            if v > 1e-9:
                vec[r] = v
        if vec:
            out[q] = vec
    return UsageHistory(as_of=now, decayed=out)


BLOCK_HALF_LIVES = 64
"""Half-lives per frame of :class:`UsageIntegral` (its sums stay small integers)."""
_MANTISSA_BITS = 52
_REACH_BLOCKS = 3
"""Frames before the one of the time asked about that still count (older ones weigh under 2^-128)."""

Step = tuple[QueueName, Resource, int, float]
"""A change of a queue's charged usage: (queue, resource, GPUs added (negative: released), when)."""


class UsageIntegral:
    """Decayed usage that depends only on which changes happened when, not on the order they are learnt.

    The decayed usage at ``T`` of a queue whose charge changed by ``d_k`` at ``t_k`` is
    ``sum_k d_k * (1 - 2^((t_k - T) / half_life))``: the same as :func:`advance` at every change (an
    exact integral of a piecewise constant charge), but kept as two sums, ``sum d_k`` and
    ``sum d_k * 2^(t_k / half_life)`` in a fixed frame, in integers: each change is one integer
    (a function of itself alone), and integer sums do not depend on the order of their terms. So a
    change learnt late (another partition, a restore reading topic by topic) is just added, and a
    change taken back (:meth:`add` with the opposite sign) cancels exactly. The frames are
    ``BLOCK_HALF_LIVES`` half-lives long, so the integers stay small; a frame more than
    ``_REACH_BLOCKS`` before the time asked about weighs less than 2^-128 of its usage and is left out
    (a rule of the sums and the time asked about alone). Half-life 0: no history (plain DRF).
    """

    __slots__ = ("_keys", "_present", "_sums", "_totals", "half_life_s")

    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self._present: dict[tuple[QueueName, Resource], int] = {}
        """Sum of the changes (GPUs) per queue and resource."""
        self._sums: dict[tuple[QueueName, Resource], dict[int, int]] = {}
        """Per queue and resource, per frame, the sum of ``d_k * 2^(t_k / half_life - frame start)``
        in units of 2^-52."""
        self._totals: dict[tuple[QueueName, Resource], tuple[int, int]] = {}
        """Per queue and resource, (first frame, the frames from it on in one integer), until it changes."""
        self._keys: list[tuple[QueueName, Resource]] | None = None
        """The queues and resources with a history, sorted, until one comes or goes."""

    def __getstate__(self) -> dict[str, object]:
        return {"half_life_s": self.half_life_s, "present": self._present, "sums": self._sums}

    def __setstate__(self, saved: dict[str, object]) -> None:
        self.half_life_s = saved["half_life_s"]  # type: ignore[assignment]
        self._present = saved["present"]  # type: ignore[assignment]
        self._sums = saved["sums"]  # type: ignore[assignment]
        self._totals = {}
        self._keys = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UsageIntegral):
            return NotImplemented
        return (self.half_life_s, self._present, self._sums) == (
            other.half_life_s,
            other._present,
            other._sums,
        )

    def __repr__(self) -> str:
        return f"UsageIntegral(half_life_s={self.half_life_s}, present={self._present})"

    def add(self, steps: Iterable[Step], sign: int = 1) -> None:
        """Count ``steps`` (``sign`` -1: take back steps counted before)."""
        if self.half_life_s <= 0:
            return
        for queue, resource, gpus, at in steps:
            if not gpus:
                continue
            d = gpus * sign
            key = (queue, resource)
            self._totals.pop(key, None)
            if key not in self._present:
                self._keys = None
            n = self._present.get(key, 0) + d
            if n:
                self._present[key] = n
            else:
                self._present.pop(key, None)
                self._keys = None
            frame, weight = self._weight(at)
            sums = self._sums.setdefault(key, {})
            v = sums.get(frame, 0) + d * weight
            if v:
                sums[frame] = v
            else:
                del sums[frame]
                if not sums:
                    del self._sums[key]
                    self._keys = None

    def _weight(self, at: float) -> tuple[int, int]:
        """(frame, 2^(at / half_life - frame start) in units of 2^-52): one integer per time."""
        x = at / self.half_life_s
        frame = math.floor(x / BLOCK_HALF_LIVES)
        f = x - frame * BLOCK_HALF_LIVES
        return frame, int(math.ldexp(2.0**f, _MANTISSA_BITS))

    def history(self, at: float) -> UsageHistory:
        """The decayed usage at ``at``, per queue and resource (values below 1e-9 GPU left out)."""
        if self.half_life_s <= 0:
            return UsageHistory(as_of=at)
        x = at / self.half_life_s
        now = math.floor(x / BLOCK_HALF_LIVES)
        first = now - _REACH_BLOCKS
        scale = first * BLOCK_HALF_LIVES - _MANTISSA_BITS - x
        weight = 2.0**scale
        out: dict[QueueName, dict[Resource, float]] = {}
        keys = self._keys
        if keys is None:
            keys = self._keys = sorted(set(self._sums) | set(self._present))
        for key in keys:
            queue, resource = key
            known = self._totals.get(key)
            if known is not None and known[0] == first:
                total = known[1]
            else:
                total = 0
                for frame, v in self._sums.get(key, {}).items():
                    if frame >= first:
                        total += v << ((frame - first) * BLOCK_HALF_LIVES)
                self._totals[key] = (first, total)
            if total.bit_length() + scale > 1000:  # changes far after ``at``: not part of its past
                continue
            value = self._present.get(key, 0) - float(total) * weight
            if value > 1e-9:
                out.setdefault(queue, {})[resource] = value
        return UsageHistory(as_of=at, decayed=out)


def dominant_share(
    usage: Mapping[Resource, float], capacity: Mapping[Resource, int], weight: float = 1.0
) -> tuple[float, Resource | None]:
    """DRF: the largest usage/capacity over resources, divided by ``weight``; and which resource it is.

    A resource the cluster has none of cannot dominate (it could never be granted anyway).
    """
    best = 0.0
    best_r: Resource | None = None
    for r in sorted(usage):
        cap = capacity.get(r, 0)
        if cap <= 0:
            continue
        s = usage[r] / cap
        if s > best:
            best, best_r = s, r
    return best / weight, best_r


class FairShare:
    """Dominant shares of every queue during one cycle; :meth:`charge` as work is admitted."""

    __slots__ = ("_alloc", "_capacity", "_decayed", "_described", "_positions", "_shares", "_weights")

    def __init__(
        self,
        *,
        capacity: Mapping[Resource, int],
        weights: Mapping[QueueName, float],
        allocation: Mapping[QueueName, Mapping[Resource, float]],
        history: UsageHistory | None = None,
    ) -> None:
        self._capacity = dict(capacity)
        self._weights = dict(weights)
        self._alloc: dict[QueueName, dict[Resource, float]] = {
            q: {r: float(n) for r, n in v.items()} for q, v in allocation.items()
        }
        self._decayed = history.decayed if history is not None else None
        self._shares: dict[QueueName, tuple[float, Resource | None]] = {}
        """Each queue's (dominant share, dominant resource), until a charge to it."""
        self._positions: dict[QueueName, int] | None = None
        """Each known queue's rank by (share, name), until any charge."""
        self._described: dict[QueueName, str] = {}
        """Each queue's :meth:`describe` sentence, until any charge."""

    def clone(self) -> FairShare:
        """An independent copy (charges to it do not reach this one)."""
        other = FairShare(capacity=self._capacity, weights=self._weights, allocation=self._alloc)
        other._decayed = self._decayed
        return other

    def usage(self, queue: QueueName) -> dict[Resource, float]:
        """The usage DRF sees: the mean of the present allocation and the decayed past, per resource.

        Without a history (half-life 0) the past is the present, so this is the allocation itself.
        """
        now = self._alloc.get(queue, {})
        if self._decayed is None:
            return dict(now)
        past = self._decayed.get(queue, {})
        return {r: (now.get(r, 0.0) + past.get(r, 0.0)) / 2.0 for r in set(now) | set(past)}

    def share(self, queue: QueueName) -> float:
        s = self._shares.get(queue)
        if s is None:
            s = self._shares[queue] = dominant_share(
                self.usage(queue), self._capacity, self._weights.get(queue, 1.0)
            )
        return s[0]

    def dominant_resource(self, queue: QueueName) -> Resource | None:
        self.share(queue)
        return self._shares[queue][1]

    def charge(self, queue: QueueName, request: ResourceVector) -> None:
        """Count work admitted in this cycle towards the queue's present allocation."""
        alloc = self._alloc.setdefault(queue, {})
        for r, n in request.items():
            alloc[r] = alloc.get(r, 0.0) + n
        self._shares.pop(queue, None)
        self._positions = None
        self._described.clear()

    def uncharge(self, queue: QueueName, request: ResourceVector) -> None:
        alloc = self._alloc.setdefault(queue, {})
        for r, n in request.items():
            alloc[r] = alloc.get(r, 0.0) - n
        self._shares.pop(queue, None)
        self._positions = None
        self._described.clear()

    def position(self, queue: QueueName) -> tuple[int, int]:
        """(rank, of how many) of the queue by share, 1 = lowest share (served first at equal priority)."""
        positions = self._positions
        if positions is None:
            known = sorted((self.share(q), q) for q in set(self._weights) | set(self._alloc))
            positions = self._positions = {q: k for k, (_, q) in enumerate(known, start=1)}
        rank = positions.get(queue)
        if rank is not None:
            return rank, len(positions)
        mine = (self.share(queue), queue)  # a queue with no weight and no allocation: ranked among them
        return 1 + sum(1 for q in positions if (self.share(q), q) < mine), len(positions) + 1

    def describe(self, queue: QueueName) -> str:
        """E.g. "team-a fair share 0.42 (dominant H100), 3rd lowest of 5 queues"."""
        text = self._described.get(queue)
        if text is None:
            rank, total = self.position(queue)
            dom = self.dominant_resource(queue)
            dom_text = f" (dominant {dom})" if dom is not None else ""
            text = f"{queue} fair share {self.share(queue):.3f}{dom_text}, position {rank} of {total} queues"
            self._described[queue] = text
        return text


def serving_share(fair: FairShare, queue: QueueName, submit_time: float, aged_before: float | None) -> float:
    """The share a queue's head is served by: its queue's, or below every share (-1) when the head has
    waited since before ``aged_before`` (the starvation bound: such jobs go first, oldest first)."""
    if aged_before is not None and submit_time <= aged_before:
        return -1.0
    return fair.share(queue)


@dataclass(frozen=True, slots=True)
class Pending(Generic[T]):
    """One pending item for :class:`FairOrder`: its queue, priority (higher first), submit time and id,
    and what its line orders it by at its priority (:func:`line_work`; 0 for all: submit order)."""

    queue: QueueName
    priority: int
    submit_time: float
    tie: str
    item: T
    work: float = 0.0


LINE_ORDERS = ("submit", "shortest-run", "shortest-work")
"""The profile's ``settings.line_order``: how a queue's line orders its jobs at one priority, after those
past the starvation bound (:func:`line_key`): by submit time; the shortest run bound first (duration
hint or time limit); or the least expected work first (GPUs times run bound). See :func:`line_work`."""


def line_work(order: str, gpus: float, run_bound_s: float | None) -> float:
    """What a job's place in its queue's line is ordered by (``Pending.work``) under ``order``: 0 for
    ``submit`` (submit order), its run bound for ``shortest-run``, GPUs times run bound for
    ``shortest-work``; with no run bound (no hint, no limit) infinite: behind every job whose is known."""
    if order == "submit":
        return 0.0
    if order not in LINE_ORDERS:
        raise ValueError(f"line_order must be one of {', '.join(LINE_ORDERS)}, not {order!r}")
    if run_bound_s is None:
        return math.inf
    return float(run_bound_s) * (gpus if order == "shortest-work" else 1.0)


def job_line_work(job: Job, order: str) -> float:
    """:func:`line_work` of a core job (a MIG slice or shared slot counts as one GPU per worker)."""
    return line_work(order, job.workers * max(1, job.gpus_per_worker), job.run_bound_s)


LineKey = tuple[int, int, float, float, str]
"""Where a pending item stands in its queue's line (:func:`line_key`)."""


def line_key(p: Pending[T], aged_before: float | None) -> LineKey:
    """Where ``p`` stands in its queue's line: higher priority first; at a priority, items waiting since
    before ``aged_before`` first (the starvation bound), oldest first; then the least work (``p.work``),
    then submit time, then id. With every ``work`` 0 that is submit order, as before the work counted."""
    if aged_before is not None and p.submit_time <= aged_before:
        return (-p.priority, 0, 0.0, p.submit_time, p.tie)
    return (-p.priority, 1, p.work, p.submit_time, p.tie)


class FairOrder(Generic[T]):
    """Serve pending work: priority first, then the lowest dominant share, then submit time, then id.

    Each queue keeps its own line (:func:`line_key`: priority, the starving first, then least work, submit
    time, id). A heap holds one head per queue, keyed
    by (-priority, queue share, submit time, id). The caller takes the best head with :meth:`next`,
    then says what happened: :meth:`admitted` (the share grows), or :meth:`skipped` (the item stays
    unplaced, the queue's next item gets its turn). Shares change only through ``charge``, so the
    heap key of a queue is refreshed each time it is pushed back.
    """

    def __init__(
        self, items: Iterable[Pending[T]], fair: FairShare, *, aged_before: float | None = None
    ) -> None:
        self._fair = fair
        self._aged_before = aged_before
        lines: dict[QueueName, list[Pending[T]]] = {}
        for p in items:
            lines.setdefault(p.queue, []).append(p)
        self._lines: dict[QueueName, Iterator[Pending[T]]] = {}
        self._heap: list[tuple[int, float, float, str, QueueName]] = []
        self._heads: dict[QueueName, Pending[T]] = {}
        for q in sorted(lines):
            line = sorted(lines[q], key=lambda p: line_key(p, aged_before))
            self._lines[q] = iter(line)
            self._advance(q)
        self._current: QueueName | None = None

    def _advance(self, queue: QueueName) -> None:
        head = next(self._lines[queue], None)
        if head is None:
            self._heads.pop(queue, None)
            return
        self._heads[queue] = head
        self._push(queue)

    def _push(self, queue: QueueName) -> None:
        h = self._heads[queue]
        share = serving_share(self._fair, queue, h.submit_time, self._aged_before)
        heapq.heappush(self._heap, (-h.priority, share, h.submit_time, h.tie, queue))

    def next(self) -> Pending[T] | None:
        """The best item now, or None when nothing is left. Answer with admitted() or skipped()."""
        if self._current is not None:
            raise RuntimeError("answer admitted() or skipped() for the previous item first")
        if not self._heap:
            return None
        *_, queue = heapq.heappop(self._heap)
        self._current = queue
        return self._heads[queue]

    def admitted(self, request: ResourceVector) -> None:
        queue = self._take()
        self._fair.charge(queue, request)
        self._advance(queue)

    def skipped(self) -> None:
        self._advance(self._take())

    def _take(self) -> QueueName:
        if self._current is None:
            raise RuntimeError("no item taken")
        q, self._current = self._current, None
        return q


def ordered(
    items: Iterable[Pending[T]], fair: FairShare, request_of: Callable[[T], ResourceVector]
) -> list[T]:
    """The full service order if every item were admitted in turn (for explanations and tests)."""
    order = FairOrder(items, fair)
    out: list[T] = []
    while (p := order.next()) is not None:
        out.append(p.item)
        order.admitted(request_of(p.item))
    return out
