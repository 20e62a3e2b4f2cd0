"""The quota gate: which waiting jobs their queues' quotas let through now, on which GPU model, in which
order, and why the others wait.

One rule for the quota service (its per-job gate in front of placement) and for the core's queue cycle
(:func:`gangline.core.actions.queueing.fair_order`, which the simulator runs): waiting jobs come in fair
order (:class:`~gangline.core.fairshare.FairOrder`: priority, then DRF dominant share over decayed usage,
then admitted time, then job id); each is let through on the first of its flavours (GPU model and
resource vector, like Kueue's flavours) its queue's quota admits now, charged to the ledger and to the
fair share at once; one that fits none is held and skipped, and smaller jobs behind it may go. A held
job is told why (:func:`hold_reason`): its queue's quota position per flavour, whether it is owed its
nominal quota (then quota lent in the cohort is reclaimed for it), or that no GPU model it may use has
nodes that can hold its workers (:func:`held_flavours`, over the core's
:class:`~gangline.core.hardware.Hardware`).

What the charge means differs by caller, not the rule: the quota service charges a job when the gate
lets it through to placement (as Kueue admits a workload: it holds that quota until its allocation is
released, placed or not yet), while the core cycle runs the gate on a copy of its ledger only to order
its jobs and charges a job's quota when it is placed (the ``quota`` plugin). A job charged to a model
whose nodes can no longer hold it and not placed yet moves to the first other flavour that fits
(:func:`stranded_move`).

A caller that runs the gate again and again over a long line (the quota service, after every release)
keeps its waiting jobs in :class:`WaitingLines` from one pass to the next: no pass sorts them again, and
a pass looks only at the jobs it lets through, the held jobs it explains and, per queue, the first job
of each request size that its quota still might admit (what it refuses once it refuses again).

Pure: the caller hands the facts of its fold (the waiting jobs, a ledger, fair shares, what the nodes
offer); nothing here reads a clock.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gangline.core.fairshare import FairOrder, FairShare, LineKey, Pending, line_key, serving_share
from gangline.core.framework.status import Reason
from gangline.core.hardware import NAME as HARDWARE
from gangline.core.hardware import HoldsWorkers, WorkerAsk
from gangline.core.model import GpuModel, QueueName
from gangline.core.queues import QuotaLedger, QuotaTree, Resource

T = TypeVar("T")

MAX_TEXT = 2000
"""Longest sentence a reason carries."""


@dataclass(frozen=True, slots=True)
class Flavour:
    """One way a job may be charged: the GPU model (None: any, for an unlimited queue) and what it uses."""

    model: str | None
    request: Mapping[Resource, int]


@dataclass(frozen=True, slots=True)
class HoldReason:
    """Why a job waits at the gate, in the shape of a pending reason (``constraint`` names the rule:
    ``quota``, ``reclaim`` when its queue is owed the quota it waits for, or ``hardware``)."""

    code: str
    constraint: str
    message: str
    details: Mapping[str, int | str | bool]
    unblock: str

    @property
    def owed(self) -> bool:
        """Whether its queue is owed what it waits for within its nominal quota (reclaim may free it)."""
        return self.constraint == "reclaim"


@dataclass
class Gate(Generic[T]):
    """What one pass of the gate decided: who goes (with the flavour charged), in fair order, and the
    first held jobs asked for (all: ``explain`` None), in fair order, with why; ``unexplained`` counts
    the other held jobs (not listed: a pass looks at a held job only as far as it must)."""

    admitted: list[tuple[T, Flavour]] = field(default_factory=list)
    held: list[tuple[T, HoldReason]] = field(default_factory=list)
    unexplained: int = 0
    admitted_ties: list[str] = field(default_factory=list)
    """The ids (``Pending.tie``) of ``admitted``, in the same order."""


Options = Callable[[T], tuple[Sequence[Flavour], Sequence[Reason]]]
"""A job's flavours its nodes can hold, in the order to try them, and why the others' nodes cannot."""


@dataclass(frozen=True, slots=True)
class QuotaRelease:
    """A charge the gate expects to be released: when (``math.inf``: not known, e.g. not placed yet)."""

    at: float
    queue: QueueName
    request: Mapping[Resource, int]


@dataclass(frozen=True, slots=True)
class GateReservation:
    """The gate's reservation for a starving job (``settings.gate_reserve``): the facts one pass needs.

    The first job past the starvation bound a pass holds (the oldest, at the highest priority: such jobs
    come first in fair order) gets the quota it waits for reserved, EASY backfill on quota: the pass works
    out when the charges held now are expected to have freed enough for it (``releases``, in any order),
    and lets a later job through only if it is expected to end by then (``now`` + its run bound) or
    leaves enough for the reserved job at that time. Without it a starving job that needs much quota at
    once (a big gang) waits until that much is free at one instant, which jobs that need less, taking
    each release as it comes, may never allow: the starvation bound was no bound for it.
    """

    now: float
    releases: Sequence[QuotaRelease]
    run_bound: Callable[[Any], float | None]
    """The run bound of a waiting job's item (duration hint or time limit; None: none)."""


@dataclass
class _Reserved(Generic[T]):
    """The reservation a pass made: for whom, from when, and the quota as it will be then."""

    job: Pending[T]
    flavours: Sequence[Flavour]
    start: float
    then: QuotaLedger


def _reserve(
    ledger: QuotaLedger, p: Pending[T], flavours: Sequence[Flavour], reservation: GateReservation
) -> _Reserved[T] | None:
    """When ``p`` fits if the held charges are released as expected (None: not even once all are)."""
    then = ledger.copy()
    for r in sorted(reservation.releases, key=lambda r: (r.at, r.queue, sorted(r.request.items()))):
        then.release(r.queue, r.request)
        if first_fit(then, p.queue, flavours) is not None:
            return _Reserved(p, flavours, max(r.at, reservation.now), then)
    return None


def _backfills(reserved: _Reserved[T], p: Pending[T], fit: Flavour, reservation: GateReservation) -> bool:
    """Whether ``p``, which fits now on ``fit``, may go without delaying the reserved job: it is expected
    to end before the reserved start, or the quota then still holds the reserved job beside it (then it
    is counted as holding its quota at that time)."""
    bound = reservation.run_bound(p.item)
    if bound is not None and reservation.now + bound <= reserved.start:
        return True
    if not fit.request:
        return True
    then = reserved.then
    then.admit(p.queue, fit.request)
    if first_fit(then, reserved.job.queue, reserved.flavours) is not None:
        return True
    then.release(p.queue, fit.request)
    return False


def held_flavours(
    hardware: HoldsWorkers | None, ask: WorkerAsk, flavours: Iterable[Flavour]
) -> tuple[list[Flavour], list[Reason]]:
    """The flavours whose model's usable nodes can hold ``ask``'s workers, and why each other cannot.

    ``hardware`` None (no node has registered yet: what the nodes hold is unknown) keeps them all, and
    so does a flavour of any model (None).
    """
    fits: list[Flavour] = []
    misfits: list[Reason] = []
    for flavour in flavours:
        if hardware is None or flavour.model is None:
            fits.append(flavour)
            continue
        status = hardware.holds(GpuModel(flavour.model), ask)
        if status.ok:
            fits.append(flavour)
        else:
            misfits.extend(status.reasons)
    return fits, misfits


class _Refusals:
    """Requests the ledger refused within one pass (where room only shrinks): each is refused again,
    and so is a larger one of the same single resource for the same queue."""

    __slots__ = ("_smallest", "_vectors", "changes")

    def __init__(self) -> None:
        self._smallest: dict[tuple[QueueName, Resource], int] = {}
        self._vectors: set[tuple[QueueName, frozenset[tuple[Resource, int]]]] = set()
        self.changes: dict[QueueName, int] = {}
        """Per queue, how many of its refusals were added: what :meth:`known` answers for it changes only
        when this grows."""

    def known(self, queue: QueueName, request: Mapping[Resource, int]) -> bool:
        if len(request) == 1:
            ((r, n),) = request.items()
            smallest = self._smallest.get((queue, r))
            return smallest is not None and n >= smallest
        return (queue, frozenset(request.items())) in self._vectors

    def add(self, queue: QueueName, request: Mapping[Resource, int]) -> None:
        self.changes[queue] = self.changes.get(queue, 0) + 1
        if len(request) == 1:
            ((r, n),) = request.items()
            self._smallest[(queue, r)] = min(n, self._smallest.get((queue, r), n))
        else:
            self._vectors.add((queue, frozenset(request.items())))


def first_fit(
    ledger: QuotaLedger, queue: QueueName, flavours: Sequence[Flavour], refusals: _Refusals | None = None
) -> Flavour | None:
    """The first of ``flavours`` the queue's quota admits now (None: none); one that charges nothing
    (an unlimited queue's) always fits."""
    for flavour in flavours:
        request = flavour.request
        if not request:
            return flavour
        if refusals is not None and refusals.known(queue, request):
            continue
        if ledger.fits(queue, request):
            return flavour
        if refusals is not None:
            refusals.add(queue, request)
    return None


def fair_admission(
    waiting: Iterable[Pending[T]],
    ledger: QuotaLedger,
    fair: FairShare,
    flavours: Callable[[T], Sequence[Flavour]],
    *,
    aged_before: float | None = None,
) -> Iterator[tuple[T, Flavour | None]]:
    """Every waiting job in fair order, with the flavour its queue's quota lets it through on (None: held).

    Each one let through is charged to ``ledger`` and ``fair`` before the next is looked at (pass copies
    to keep the caller's). A held job is skipped: its queue's share does not grow, and the jobs behind
    it may go. ``flavours`` gives a job's flavours in the order to try them (those its nodes can hold).
    """
    for p, fit in _admission(waiting, ledger, fair, flavours, aged_before):
        yield p.item, fit


def _admission(
    waiting: Iterable[Pending[T]],
    ledger: QuotaLedger,
    fair: FairShare,
    flavours: Callable[[T], Sequence[Flavour]],
    aged_before: float | None = None,
) -> Iterator[tuple[Pending[T], Flavour | None]]:
    order = FairOrder(waiting, fair, aged_before=aged_before)
    refusals = _Refusals()
    while (p := order.next()) is not None:
        fit = first_fit(ledger, p.queue, flavours(p.item), refusals)
        if fit is None:
            order.skipped()
            yield p, None
            continue
        if fit.request:
            ledger.admit(p.queue, fit.request)
        order.admitted(fit.request)
        yield p, fit


def let_through(
    waiting: Iterable[Pending[T]],
    ledger: QuotaLedger,
    fair: FairShare,
    tree: QuotaTree,
    options: Options[T],
    *,
    explain: int | None = None,
    aged_before: float | None = None,
) -> Gate[T]:
    """The gate's decisions over ``waiting`` (ids unique): :func:`fair_admission` (``ledger`` and ``fair``
    are charged with the jobs let through), then, for the first ``explain`` held jobs (all: None), why
    they wait (:func:`hold_reason`, against what is charged once every job let through is).

    The same as :meth:`WaitingLines.let_through` over lines of ``waiting`` built for this pass alone.
    """
    lines: WaitingLines[T] = WaitingLines.of(waiting, lambda job: options(job)[0])
    return lines.let_through(ledger, fair, tree, options, explain=explain, aged_before=aged_before)


_LineKey = LineKey
"""Where a job stands in its queue's line (:func:`~gangline.core.fairshare.line_key`), kept as it is
when nothing starves; a pass puts the jobs past the starvation bound first."""

_Signature = tuple[tuple[str | None, tuple[tuple[Resource, int], ...]], ...]
"""What a job may be charged, flavour by flavour: jobs of a queue with the same are refused alike."""


def _signature(flavours: Sequence[Flavour]) -> _Signature:
    return tuple((f.model, tuple(sorted(f.request.items()))) for f in flavours)


class _SubLine(Generic[T]):
    """The jobs of one queue's line that may go on the same flavours (one signature), in line order, and
    their line keys by submit time (those past the starvation bound are a prefix of it)."""

    __slots__ = ("by_submit", "entries", "flavours", "keys")

    def __init__(self, flavours: Sequence[Flavour]) -> None:
        self.flavours = tuple(flavours)
        self.keys: list[_LineKey] = []
        self.entries: list[tuple[Pending[T], Sequence[Flavour]]] = []
        self.by_submit: list[tuple[float, str, _LineKey]] = []


class WaitingLines(Generic[T]):
    """Waiting jobs in fair order's lines (per queue, by priority, submit time and id), kept from one
    pass of the gate to the next: a caller adds (:meth:`put`) and takes away (:meth:`discard`) the jobs
    whose facts change, and a pass (:meth:`let_through`) reads them without sorting anything.

    Each queue's line is kept as sub-lines, one per signature (the flavours a job may go on, with what
    each charges). Within a pass the quota only shrinks, so a request refused once is refused again
    (:class:`_Refusals`); once as many held jobs as are to be explained were met, a sub-line whose every
    flavour is refused can hold back nobody (skipping a job that is refused has no effect), and is
    passed over whole: the jobs let through, their order and the held jobs explained are those of
    the plain fair order over every job (:func:`fair_admission`), which walks every job instead.
    """

    __slots__ = ("_lines", "_where")

    def __init__(self) -> None:
        self._lines: dict[QueueName, dict[_Signature, _SubLine[T]]] = {}
        self._where: dict[str, tuple[QueueName, _Signature, _LineKey]] = {}

    @classmethod
    def of(cls, waiting: Iterable[Pending[T]], flavours: Callable[[T], Sequence[Flavour]]) -> WaitingLines[T]:
        """Lines of ``waiting``, each job to go on ``flavours(job)``."""
        lines: WaitingLines[T] = cls()
        for p in waiting:
            lines.put(p, flavours(p.item))
        return lines

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, tie: object) -> bool:
        return tie in self._where

    def put(self, p: Pending[T], flavours: Sequence[Flavour]) -> None:
        """``p`` waits in its queue's line, to go on ``flavours`` (replacing the job of the same id)."""
        signature = _signature(flavours)
        key = line_key(p, None)
        where = self._where.get(p.tie)
        if where is not None:
            if where == (p.queue, signature, key):  # its place is the same: only what it carries changes
                same = self._lines[p.queue][signature]
                same.entries[bisect_left(same.keys, key)] = (p, flavours)
                return
            self.discard(p.tie)
        subs = self._lines.setdefault(p.queue, {})
        line = subs.get(signature)
        if line is None:
            line = subs[signature] = _SubLine(flavours)
        k = bisect_left(line.keys, key)
        line.keys.insert(k, key)
        line.entries.insert(k, (p, flavours))
        by_submit = (p.submit_time, p.tie, key)
        line.by_submit.insert(bisect_left(line.by_submit, by_submit), by_submit)
        self._where[p.tie] = (p.queue, signature, key)

    def discard(self, tie: str) -> None:
        """The job of id ``tie`` no longer waits (nothing when it was not waiting)."""
        where = self._where.pop(tie, None)
        if where is None:
            return
        queue, signature, key = where
        subs = self._lines[queue]
        sub = subs[signature]
        k = bisect_left(sub.keys, key)
        del sub.keys[k]
        del sub.entries[k]
        del sub.by_submit[bisect_left(sub.by_submit, (key[3], key[4], key))]
        if not sub.keys:
            del subs[signature]
            if not subs:
                del self._lines[queue]

    def let_through(
        self,
        ledger: QuotaLedger,
        fair: FairShare,
        tree: QuotaTree,
        options: Options[T],
        *,
        explain: int | None = None,
        aged_before: float | None = None,
        reservation: GateReservation | None = None,
    ) -> Gate[T]:
        """The gate's decisions over the waiting jobs (:func:`let_through`); the lines stay as they are.
        Jobs waiting since before ``aged_before`` are served first
        (:func:`~gangline.core.fairshare.serving_share`); with ``reservation``, the first held job's quota
        is reserved (:class:`GateReservation`)."""
        gate: Gate[T] = Gate()
        reserved: list[_Reserved[T]] = []
        held = self._pass(gate, ledger, fair, explain, aged_before, reservation, reserved)
        reasons: dict[_ReasonKey, HoldReason] = {}
        for p in held:
            flavours, misfits = options(p.item)
            # Nothing is charged any more in this pass: the reason is a function of what it is asked about.
            if reserved and p is not reserved[0].job and first_fit(ledger, p.queue, flavours) is not None:
                gate.held.append((p.item, reserved_reason(p.queue, reserved[0].job, reserved[0].start)))
                continue
            key = reason_key(p.queue, flavours, misfits)
            why = reasons.get(key)
            if why is None:
                why = reasons[key] = hold_reason(p.queue, flavours, misfits, ledger, tree, fair)
            gate.held.append((p.item, why))
        return gate

    def _pass(
        self,
        gate: Gate[T],
        ledger: QuotaLedger,
        fair: FairShare,
        explain: int | None,
        aged_before: float | None,
        reservation: GateReservation | None = None,
        reserved: list[_Reserved[T]] | None = None,
    ) -> list[Pending[T]]:
        """Fair order over the lines (see the class): the jobs let through go to ``gate`` (charged to
        ``ledger`` and ``fair``); the first ``explain`` held are returned, the others counted. With
        ``reservation``, the first held job's reservation goes to ``reserved``, and a job that fits
        is held when it would delay it (:func:`_backfills`)."""
        refusals = _Refusals()
        exact = explain is None or explain > 0
        reserving = reservation is not None and reserved is not None
        if reserving:
            exact = True  # a job the reservation holds is refused by no ledger: no sub-line is passed over
        held: list[Pending[T]] = []
        # Per queue, a cursor per sub-line: [keys, entries, next index, flavours]; the jobs past the
        # starvation bound in a cursor of their own (flavours None), first, and skipped in their sub-lines.
        cursors: dict[QueueName, list[list[Any]]] = {}
        heads: dict[QueueName, list[Any]] = {}
        heap: list[tuple[int, float, float, str, QueueName]] = []
        starving: set[str] = set()
        checked: dict[QueueName, int] = {}
        """Per queue, its ``refusals.changes`` when its cursors were last cut to those not refused."""

        def push(queue: QueueName) -> None:
            live = cursors[queue]
            if not exact and checked.get(queue) != (changes := refusals.changes.get(queue, 0)):
                # What is refused now is refused for the rest of the pass; until another refusal is
                # added for the queue, the cursors kept are still all not refused.
                live = cursors[queue] = [
                    c
                    for c in live
                    if c[2] < len(c[0]) and (c[3] is None or not _refused(refusals, queue, c[3]))
                ]
                checked[queue] = changes
            best: _LineKey | None = None
            chosen: list[Any] | None = None
            for c in live:
                keys, entries = c[0], c[1]
                i = c[2]
                if c[3] is not None:
                    while i < len(keys) and entries[i][0].tie in starving:
                        i += 1  # served from the starving cursor
                    c[2] = i
                if i >= len(keys):
                    continue
                k = keys[i]
                if best is None or k < best:
                    best, chosen = k, c
            if best is None or chosen is None:
                return
            heads[queue] = chosen
            heapq.heappush(
                heap, (best[0], serving_share(fair, queue, best[3], aged_before), best[3], best[4], queue)
            )

        for queue in sorted(self._lines):
            subs = self._lines[queue].values()
            cursors[queue] = [[s.keys, s.entries, 0, s.flavours] for s in subs]
            if aged_before is not None:
                aged = _starving(subs, aged_before)
                if aged:
                    starving.update(p.tie for _, (p, _) in aged)
                    cursors[queue].append([[k for k, _ in aged], [e for _, e in aged], 0, None])
            push(queue)
        while heap:
            queue = heapq.heappop(heap)[4]
            c = heads[queue]
            p, flavours = c[1][c[2]]
            c[2] += 1
            fit = first_fit(ledger, queue, flavours, refusals)
            if reserving and reservation is not None and reserved is not None:
                if fit is None and not reserved and aged_before is not None and p.submit_time <= aged_before:
                    made = _reserve(ledger, p, flavours, reservation)
                    if made is not None:
                        reserved.append(made)
                elif fit is not None and reserved and not _backfills(reserved[0], p, fit, reservation):
                    fit = None
                if fit is None:
                    if explain is None or len(held) < explain:
                        held.append(p)
                    push(queue)
                    continue
            if fit is None:
                if exact:
                    held.append(p)
                    if explain is not None and len(held) >= explain:
                        exact = False
            else:
                if fit.request:
                    ledger.admit(queue, fit.request)
                fair.charge(queue, fit.request)
                gate.admitted.append((p.item, fit))
                gate.admitted_ties.append(p.tie)
            push(queue)
        gate.unexplained = len(self) - len(gate.admitted) - len(held)  # passed over whole, or refused
        return held


def _starving(
    subs: Iterable[_SubLine[T]], aged_before: float
) -> list[tuple[_LineKey, tuple[Pending[T], Sequence[Flavour]]]]:
    """The jobs of a queue's sub-lines waiting since before ``aged_before``, in line order (their
    :func:`~gangline.core.fairshare.line_key` then: the oldest first at a priority)."""
    out: list[tuple[_LineKey, tuple[Pending[T], Sequence[Flavour]]]] = []
    for sub in subs:
        for submit, tie, key in sub.by_submit:
            if submit > aged_before:
                break
            p, flavours = sub.entries[bisect_left(sub.keys, key)]
            out.append(((key[0], 0, 0.0, submit, tie), (p, flavours)))
    out.sort(key=lambda e: e[0])
    return out


def _refused(refusals: _Refusals, queue: QueueName, flavours: Sequence[Flavour]) -> bool:
    """Whether every one of ``flavours`` was refused to ``queue`` in this pass (so it is again)."""
    return all(bool(f.request) and refusals.known(queue, f.request) for f in flavours)


_ReasonKey = tuple[
    QueueName,
    tuple[tuple[str | None, tuple[tuple[Resource, int], ...]], ...],
    tuple[tuple[str, str, str, tuple[tuple[str, int | str], ...]], ...],
]


def reason_key(queue: QueueName, flavours: Sequence[Flavour], misfits: Sequence[Reason]) -> _ReasonKey:
    """Everything :func:`hold_reason` reads of a job (with the ledger, tree and fair shares fixed): two
    jobs with the same key are held for the same reason, word for word (orders kept: they show)."""
    return (
        queue,
        tuple((f.model, tuple(f.request.items())) for f in flavours),
        tuple((r.code.value, r.plugin, r.message, tuple(r.details.items())) for r in misfits),
    )


def hold_reason(
    queue: QueueName,
    flavours: Sequence[Flavour],
    misfits: Sequence[Reason],
    ledger: QuotaLedger,
    tree: QuotaTree,
    fair: FairShare,
) -> HoldReason:
    """Why a job of ``queue`` waits: per flavour its nodes can hold (``flavours``), why the queue's quota
    cannot take it now, with the figures of the first; why the others' nodes cannot (``misfits``); and
    whether its queue is owed it within its nominal quota (constraint ``reclaim``: the cohort lent it).
    With no flavour its nodes can hold, :func:`hardware_reason`."""
    if not flavours:
        return hardware_reason(queue, misfits)
    checks = [(f.model, ledger.check(queue, f.request)) for f in flavours]
    if len(checks) == 1 and not misfits:
        message = checks[0][1].reason
    else:
        message = "; ".join(
            [f"on {model}: {check.reason}" for model, check in checks]
            + [f"{r.details['gpu_type']} cannot hold it: {r.message}" for r in misfits]
        )
    first = flavours[0]
    request = first.request
    if not request:  # charges nothing: not quota's to hold (a queue the configuration does not limit)
        message = f"queue {queue} is not limited by the queue configuration"
        return HoldReason("quota", "quota", message, {"queue": queue, "gpu_type": "any"}, message)
    short = next(
        (r for r in sorted(request) if request[r] > ledger.available(queue, r)), next(iter(sorted(request)))
    )
    needed = request[short]
    missing = needed - max(0, ledger.available(queue, short))
    limited = tree.has_queue(queue)
    details: dict[str, int | str | bool] = {
        "queue": queue,
        "gpu_type": first.model or "any",
        "resource": short,
        "needed": needed,
        "used": ledger.usage(queue, short) if limited else 0,
        "nominal": tree.nominal(queue, short) if limited else 0,
        "cohort_can_lend": ledger.cohort_lendable(queue, short) if limited else 0,
        "fair_share": sentence(fair.describe(queue)),
    }
    message = message or f"queue {queue} cannot hold this job now"
    owed = (
        next((f.model for f in flavours if ledger.within_nominal(queue, f.request)), None)
        if limited
        else None
    )
    details["within_nominal"] = owed is not None
    if owed is None:
        return HoldReason(
            code="quota",
            constraint="quota",
            message=sentence(message),
            details=details,
            unblock=sentence(
                f"wait until {missing} more {short} is free to queue {queue} or its cohort, or "
                "lower-priority preemptible work of the queue gives it back (the preemption service asks)"
            ),
        )
    details["gpu_type"] = owed
    on = f" on {owed}" if owed != first.model else ""
    return HoldReason(
        code="quota",
        constraint="reclaim",
        message=sentence(
            f"{message}; queue {queue} is owed this within its nominal quota{on}: the cohort lent it "
            "to other queues, and the preemption service reclaims it from their preemptible jobs"
        ),
        details=details,
        unblock=sentence("jobs borrowing the cohort's quota checkpoint and release their GPUs"),
    )


def reserved_reason(queue: QueueName, holder: Pending[Any], start: float) -> HoldReason:
    """Why a job its quota admits now waits: the quota is reserved for ``holder`` (the gate's
    reservation, :class:`GateReservation`), and it is not expected to end before ``start``."""
    when = f"t={start:g}" if math.isfinite(start) else "once charges with no known end are released"
    message = (
        f"quota is reserved for job {holder.tie} of queue {holder.queue} (first in the gate's order) from "
        f"{when}; this job is not expected to end before then and would leave too little for it"
    )
    details: dict[str, int | str | bool] = {"queue": queue, "reserved_for": holder.tie, "start": str(start)}
    return HoldReason(
        code="quota",
        constraint="reservation",
        message=sentence(message),
        details=details,
        unblock=sentence(f"job {holder.tie} is let through, or a duration hint shows this job ends before"),
    )


def hardware_reason(queue: QueueName, misfits: Sequence[Reason]) -> HoldReason:
    """Why no GPU model a job may be charged to has nodes that can hold its workers: it waits, not
    charged, until nodes that can register or recover (the figures are the first model's)."""
    first = misfits[0]
    if len(misfits) == 1:
        message = first.message
    else:
        message = "; ".join(f"on {r.details['gpu_type']}: {r.message}" for r in misfits)
    models = ", ".join(str(r.details["gpu_type"]) for r in misfits)
    details: dict[str, int | str | bool] = {"queue": queue}
    details.update({k: v for k, v in first.details.items() if isinstance(v, int | str | bool)})
    return HoldReason(
        code=first.code.value,
        constraint=HARDWARE,
        message=sentence(message),
        details=details,
        unblock=sentence(
            f"a {models} node that can hold its workers registers, or its GPUs recover; "
            "or ask for fewer GPUs per worker"
        ),
    )


def stranded_move(
    queue: QueueName,
    charged: Flavour,
    flavours: Sequence[Flavour],
    ledger: QuotaLedger,
) -> Flavour | None:
    """Where to move a job charged to ``charged`` and not placed yet, whose model's nodes can no
    longer hold it (drained, failed or gone): the first other flavour its nodes can hold
    (``flavours``) that its queue's quota admits once its current charge is given back; None when
    none does (it stays charged where it is, and is looked at again when quota or the nodes change)."""
    trial = ledger.copy()
    if charged.request:
        trial.release(queue, charged.request)
    others = [f for f in flavours if f.model != charged.model]
    return first_fit(trial, queue, others)


def sentence(text: str) -> str:
    """``text`` cut to what an event carries."""
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"
