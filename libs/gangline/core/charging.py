"""When quota is charged: when the quota gate lets a job through to placement, until its allocation is
released (Kueue's quota reservation). The one charge point of both engines; see docs/charge-point.md.

A job its queue's quota admits is charged at once, placed or not yet, and keeps the charge while it
waits for placement and while it runs; the charge goes when its allocation is released (it ended, was
preempted, its node failed) or it ends. So the sum of the charges of a queue never exceeds what its
quota and its cohort allow, whatever placement does, and what quota reasons about (who is owed its
nominal quota, who borrows, what a reclaim frees) is what is charged.

:class:`QuotaCharges` is that rule, and the one object both engines decide with: the quota service
(``services/quota/handlers.py``) folds its events, asks it and writes what it answered; the core's
simulator (``gangline.sim.gated``) calls it directly (:meth:`QuotaCharges.arrive`,
:meth:`~QuotaCharges.release`, :meth:`~QuotaCharges.let_through`). It holds the ledger (what is
charged, per queue), the held jobs in the gate's sorted lines
(:class:`~gangline.core.quota_gate.WaitingLines`, per quota tree), and the fair shares: the charged
usage and its decayed history (:class:`~gangline.core.fairshare.UsageIntegral`: a function of which
charges changed when, not of the order they were learnt). A job that arrives goes through on the
first flavour its queue's quota admits now (:func:`~gangline.core.quota_gate.first_fit`) or is held;
whenever a release lowers a quota tree's usage, the held jobs of that tree go through in fair order
(:meth:`QuotaCharges.gate`). Two of the profile's settings bend that order: ``starvation_s``, a held
job admitted longer ago goes first, oldest first (:meth:`QuotaCharges.aged_before`, both engines), and
``gate_credit_s``, what is charged to jobs not placed yet is lent to short held jobs
(:meth:`QuotaCharges.lend`, :mod:`gangline.core.gate_credit`; the core's simulator only).

Pure: times are given (seconds on the caller's clock), nothing is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Generic, TypeVar

from gangline.core.fairshare import FairShare, Pending, Step, UsageHistory, UsageIntegral
from gangline.core.framework.status import Reason
from gangline.core.gate_credit import CreditPolicy, credit_left, lend
from gangline.core.model import JobId, QueueName
from gangline.core.queues import QuotaLedger, QuotaTree, Resource
from gangline.core.quota_gate import (
    Flavour,
    Gate,
    GateReservation,
    HoldReason,
    Options,
    QuotaRelease,
    WaitingLines,
    first_fit,
    hold_reason,
)

T = TypeVar("T")

DEFAULT_HALF_LIFE_S = 3600.0
"""Fair share's usage half-life unless configured (the quota service's default)."""


@dataclass(frozen=True, slots=True)
class Charge:
    """What the ledger holds for a job: its queue and the flavour it was let through on."""

    queue: QueueName
    flavour: Flavour


def usage_steps(
    queue: QueueName, request: Mapping[Resource, int], start: float, end: float | None
) -> list[Step]:
    """The usage changes of holding ``request`` for ``queue`` from ``start`` until ``end`` (None: still)."""
    steps: list[Step] = [(queue, r, n, start) for r, n in sorted(request.items())]
    if end is not None:
        steps += [(queue, r, -n, end) for r, n in sorted(request.items())]
    return steps


class QuotaCharges(Generic[T]):
    """The quota gate with charges from let-through to release (see the module docstring).

    Only jobs of the tree's queues are its business: the caller sends the others straight to placement
    (a queue the configuration does not limit). ``options`` gives a job's flavours its nodes can hold,
    in the order to try them (none: it waits, uncharged, until they can), and why the others cannot;
    when what it answers changes (the nodes changed), the caller says so (:meth:`reflavour`).
    """

    def __init__(
        self,
        tree: QuotaTree,
        options: Options[T],
        *,
        half_life_s: float = DEFAULT_HALF_LIFE_S,
        starvation_s: float | None = None,
        credit: CreditPolicy | None = None,
        run_bound: Callable[[T], float | None] | None = None,
        expected_release: Callable[[JobId, float], float | None] | None = None,
    ) -> None:
        if credit is not None and run_bound is None:
            raise ValueError("the gate's backfill (credit) needs the held jobs' run bounds (run_bound)")
        if expected_release is not None and run_bound is None:
            raise ValueError("the gate's reservation needs the held jobs' run bounds (run_bound)")
        self.expected_release = expected_release
        """When a charged job's charge is expected to go, asked at a time: a placed job's grant time plus
        its run bound, one not placed yet that time plus its run bound (as if placed then: both engines
        answer alike whether or not placement's grant of the same instant was read); None: no bound.
        Given, the gate reserves quota for the oldest job past ``starvation_s`` it holds
        (:class:`~gangline.core.quota_gate.GateReservation`)."""
        self.tree = tree
        self.starvation_s = starvation_s
        """A held job admitted longer ago than this goes ahead of fair order, oldest first (None: never)."""
        self.credit = credit
        """The gate's backfill (:meth:`lend`; None: off)."""
        self._run_bound = run_bound
        self.ledger = QuotaLedger(tree)
        self.half_life_s = half_life_s
        self.usage = UsageIntegral(half_life_s)
        """The decayed history's sums: what was charged when (see :meth:`count_usage`)."""
        self.charges: dict[JobId, Charge] = {}
        self._options = options
        self._queues = [QueueName(q) for q in tree.queue_names()]
        self._tree_queues: dict[str, list[QueueName]] = {}
        for q in self._queues:
            self._tree_queues.setdefault(tree.root_cohort_of(q), []).append(q)
        self._capacity = {r: tree.total_nominal(r) for r in sorted(tree.resources)}
        self._held: dict[str, dict[str, Pending[T]]] = {}
        """Jobs waiting at the gate (nothing charged), per quota tree (its root's name), by id."""
        self._lines: dict[str, tuple[int, WaitingLines[T]]] = {}
        """``_held`` in the gate's lines per tree, as of a version of ``options`` (:meth:`reflavour`)."""
        self._version = 0
        self._charged: dict[QueueName, dict[Resource, int]] | None = None
        """What the ledger charges per queue (:meth:`charged`), until it changes."""
        self._decayed: tuple[float, UsageHistory] | None = None
        """(time, the history then) of the last :meth:`fair_share`, until the usage changes."""
        self.unplaced: dict[JobId, Charge] = {}
        """Charged and not placed yet (:meth:`placed`): what the gate's backfill lends."""
        self.lent: dict[JobId, Charge] = {}
        """Let through on credit (:mod:`gangline.core.gate_credit`), not charged, until released."""
        self._lent_from: dict[JobId, Pending[T]] = {}
        """The held items of the jobs :attr:`lent` is for (back to the gate on :meth:`unlend`)."""

    def limits(self, queue: str) -> bool:
        """Whether ``queue``'s jobs are charged here (a queue of the tree)."""
        return self.tree.has_queue(queue)

    def root(self, queue: str) -> str:
        """The quota tree ``queue`` is charged in (its root cohort's name)."""
        return self.tree.root_cohort_of(QueueName(queue))

    # -- the gate ------------------------------------------------------------------------------------

    def first_fit(self, queue: str, flavours: Sequence[Flavour]) -> Flavour | None:
        """The first of ``flavours`` the queue's quota admits now (None: none)."""
        return first_fit(self.ledger, QueueName(queue), flavours)

    def hold(self, p: Pending[T]) -> None:
        """``p``'s job waits at the gate (replacing the one of the same id)."""
        root = self.root(p.queue)
        self._held.setdefault(root, {})[p.tie] = p
        entry = self._lines.get(root)
        if entry is not None and entry[0] == self._version:
            entry[1].put(p, self._options(p.item)[0])

    def unhold(self, job_id: str, queue: str) -> None:
        """The job of ``queue`` no longer waits at the gate (nothing when it did not)."""
        root = self.root(queue)
        held = self._held.get(root)
        if held is None or held.pop(job_id, None) is None:
            return
        if not held:
            del self._held[root]
        entry = self._lines.get(root)
        if entry is not None:
            entry[1].discard(job_id)

    def holds(self, root: str) -> bool:
        """Whether any job waits at the gate in tree ``root``."""
        return bool(self._held.get(root))

    def reflavour(self) -> None:
        """What ``options`` answers may have changed (the nodes changed): the lines are sorted again."""
        self._version += 1

    def waiting_lines(self, root: str) -> WaitingLines[T]:
        """The tree's held jobs in the gate's lines, built once per version of ``options``, then kept."""
        entry = self._lines.get(root)
        if entry is None or entry[0] != self._version:
            held = self._held.get(root, {}).values()
            entry = self._lines[root] = (self._version, WaitingLines.of(held, lambda j: self._options(j)[0]))
        return entry[1]

    def gate(self, root: str, at: float, *, explain: int | None = 0) -> Gate[T]:
        """Usage in tree ``root`` dropped: its held jobs in fair order, each let through while it fits,
        and why the first ``explain`` held ones wait (on copies: nothing is charged here)."""
        if not self._held.get(root):
            return Gate()
        lines = self.waiting_lines(root)
        return lines.let_through(
            self.ledger.copy(),
            self.fair_share(root, at),
            self.tree,
            self._options,
            explain=explain,
            aged_before=self.aged_before(at),
            reservation=self.reservation(root, at),
        )

    def reservation(self, root: str, at: float) -> GateReservation | None:
        """The facts of the gate's reservation in tree ``root`` at ``at`` (None: the gate reserves nothing):
        every charge of the tree, with when it is expected to be released. Only a job past the starvation
        bound reserves, so without one (or with no held job past it) nothing is worked out."""
        expected, bound, aged = self.expected_release, self._run_bound, self.aged_before(at)
        if expected is None or bound is None or aged is None:
            return None
        held = self._held.get(root, {})
        if not any(p.submit_time <= aged for p in held.values()):
            return None
        releases = []
        for job_id, charge in self.charges.items():
            if charge.flavour.request and self.root(charge.queue) == root:
                end = expected(job_id, at)
                releases.append(
                    QuotaRelease(math.inf if end is None else end, charge.queue, charge.flavour.request)
                )
        return GateReservation(at, releases, bound)

    def reserves(self, root: str, at: float) -> bool:
        """Whether an arrival in tree ``root`` must go through a pass of the gate rather than the first
        fit: the gate reserves quota and holds a job past the starvation bound there."""
        aged = self.aged_before(at)
        if self.expected_release is None or aged is None:
            return False
        return any(p.submit_time <= aged for p in self._held.get(root, {}).values())

    def aged_before(self, at: float) -> float | None:
        """The starvation bound at ``at``: a held job admitted at or before it goes ahead of fair order,
        oldest first (:func:`~gangline.core.fairshare.serving_share`; None: no bound)."""
        return at - self.starvation_s if self.starvation_s is not None else None

    def hold_reason(
        self, queue: str, flavours: Sequence[Flavour], misfits: Sequence[Reason], fair: FairShare
    ) -> HoldReason:
        """Why a job of ``queue`` that fits none of ``flavours`` now waits (the gate's reason)."""
        return hold_reason(QueueName(queue), flavours, misfits, self.ledger, self.tree, fair)

    # -- charges -------------------------------------------------------------------------------------

    def set_charge(self, job_id: JobId, charge: Charge | None) -> str | None:
        """The ledger holds ``charge`` for the job now (None: nothing); the tree of the charge it held
        before (None: it held none). The decayed history is the caller's (:meth:`count_usage`)."""
        before = self.charges.pop(job_id, None)
        if before is not None and before.flavour.request:
            self.ledger.release(before.queue, before.flavour.request)
        if charge is not None:
            if charge.flavour.request:
                self.ledger.admit(charge.queue, charge.flavour.request)
            self.charges[job_id] = charge
        else:
            self.unplaced.pop(job_id, None)
        if before != charge:
            self._charged = None
        return self.root(before.queue) if before is not None else None

    def count_usage(self, steps: Iterable[Step], *, taken_back: Iterable[Step] = ()) -> None:
        """The charges changed by ``steps`` (each dated to when it happened), and the ``taken_back``
        steps counted before did not happen (a job's charges worked out again): the decayed history is
        the same whatever the order in which they are counted."""
        self.usage.add(taken_back, -1)
        self.usage.add(steps)
        self._decayed = None

    def charged(self, queues: Iterable[QueueName] | None = None) -> dict[QueueName, dict[Resource, int]]:
        """What the ledger charges per queue (of ``queues``; all), queues charged nothing left out.
        Worked out once per change of the ledger: read it, never change it."""
        charged = self._charged
        if charged is None:
            ledger = self.ledger
            charged = self._charged = {q: v for q in self._queues if (v := ledger.usage_vector(q))}
        if queues is None:
            return charged
        return {q: charged[q] for q in queues if q in charged}

    def history(self, at: float) -> UsageHistory | None:
        """The decayed usage at ``at`` (None under plain DRF, half-life 0)."""
        if self.half_life_s <= 0:
            return None
        known = self._decayed
        if known is not None and known[0] == at:
            return known[1]
        history = self.usage.history(at)
        self._decayed = (at, history)
        return history

    def fair_share(self, root: str, at: float) -> FairShare:
        """Dominant shares of the tree's queues: charged usage now, and the history decayed to ``at``."""
        queues = self._tree_queues.get(root, [])
        return FairShare(
            capacity=self._capacity,
            weights={q: self.tree.weight(q) for q in queues},
            allocation=self.charged(queues),
            history=self.history(at),
        )

    # -- the rule in one call each (the core's simulator) ---------------------------------------------

    def arrive(self, pending: Pending[T], at: float) -> Flavour | None:
        """A job admitted (or requeued, keeping its admitted time in ``pending``): charged and let
        through on the first flavour its queue's quota admits now, or held (None). Where the gate
        reserves (:meth:`reserves`) the caller uses :meth:`arrive_in_turn` instead."""
        fit = self.first_fit(pending.queue, self._options(pending.item)[0])
        if fit is not None:
            self._charge(JobId(pending.tie), pending.queue, fit, at)
            return fit
        self.hold(pending)
        return None

    def arrive_in_turn(self, pending: Pending[T], at: float) -> list[tuple[T, Flavour]]:
        """A job admitted where the gate reserves quota (:meth:`reserves`): held, then the tree's held
        jobs go in the gate's order (:meth:`let_through`), so it passes no reservation; who went."""
        self.hold(pending)
        return self.let_through(self.root(pending.queue), at)

    def release(self, job_id: JobId, at: float) -> str | None:
        """The job's allocation was released (or it ended): its charge goes. The tree whose usage it
        lowered (None: nothing was charged)."""
        loan = self.lent.pop(job_id, None)
        if loan is not None:  # let through on credit: nothing was charged, the credit is lent again
            self._lent_from.pop(job_id, None)
            return self.root(loan.queue)
        charge = self.charges.get(job_id)
        if charge is None:
            return None
        self.count_usage([(charge.queue, r, -n, at) for r, n in sorted(charge.flavour.request.items())])
        return self.set_charge(job_id, None)

    def let_through(self, root: str, at: float) -> list[tuple[T, Flavour]]:
        """Usage in tree ``root`` dropped: its held jobs in fair order, each charged while it fits."""
        held = self._held.get(root)
        if not held:
            return []
        gate = self.gate(root, at)
        for (_, fit), tie in zip(gate.admitted, gate.admitted_ties, strict=True):
            p = held[tie]
            self.unhold(p.tie, p.queue)
            self._charge(JobId(p.tie), p.queue, fit, at)
        return gate.admitted

    def placed(self, job_id: JobId) -> None:
        """Placement placed the job: its charge stands for running GPUs now, and is lent no more."""
        self.unplaced.pop(job_id, None)

    def lend(self, at: float, exclude: AbstractSet[str] = frozenset()) -> list[tuple[T, Flavour]]:
        """After placement's try: held jobs (but those of ids in ``exclude``) let through on what is
        charged to jobs still unplaced (:func:`gangline.core.gate_credit.lend`), tree by tree, in the
        gate's order (the starvation bound's included); nothing without a credit policy. A job lent to
        that placement does not place at once is handed back (:meth:`unlend`)."""
        if self.credit is None or self._run_bound is None or not self.unplaced:
            return []
        out: list[tuple[T, Flavour]] = []
        root = self.root
        for tree in sorted(self._held):
            held = self._held.get(tree)
            if not held:
                continue
            credit = credit_left(
                (c.flavour.request for c in self.unplaced.values() if root(c.queue) == tree),
                (c.flavour.request for c in self.lent.values() if root(c.queue) == tree),
            )
            if not credit:
                continue
            candidates = [p for p in held.values() if p.tie not in exclude]
            by_item = {id(p.item): p for p in candidates}
            lent = lend(
                candidates,
                credit,
                self.fair_share(tree, at),
                lambda item: self._options(item)[0],
                self.credit,
                run_bound=self._run_bound,
                aged_before=self.aged_before(at),
            )
            for item, fit in lent:
                p = by_item[id(item)]
                self.unhold(p.tie, p.queue)
                self._lent_from[JobId(p.tie)] = p
                self.lent[JobId(p.tie)] = Charge(p.queue, fit)
                out.append((item, fit))
        return out

    def unlend(self, job_id: JobId) -> None:
        """A job lent credit that placement could not place: back to the gate's held jobs, its credit
        back to lend again."""
        if self.lent.pop(job_id, None) is None:
            return
        self.hold(self._lent_from.pop(job_id))

    def _charge(self, job_id: JobId, queue: QueueName, flavour: Flavour, at: float) -> None:
        self.count_usage(usage_steps(queue, flavour.request, at, None))
        self.set_charge(job_id, Charge(queue, flavour))
        self.unplaced[job_id] = self.charges[job_id]
