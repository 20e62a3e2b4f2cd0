"""When quota is charged: when the quota gate lets a job through to placement, until its allocation is
released (Kueue's quota reservation). The one charge point of both engines; see docs/charge-point.md.

A job its queue's quota admits is charged at once, placed or not yet, and keeps the charge while it
waits for placement and while it runs; the charge goes when its allocation is released (it ended, was
preempted, its node failed) or it ends. So the sum of the charges of a queue never exceeds what its
quota and its cohort allow, whatever placement does, and what quota reasons about (who is owed its
nominal quota, who borrows, what a reclaim frees) is what is charged.

:class:`QuotaCharges` is that rule over core jobs, in the order the quota service applies it to its
events (``services/quota/handlers.py``: ``job.admitted`` / ``job.requeued``, then each release): a job
that arrives is let through on the first flavour its queue's quota admits now
(:func:`~gangline.core.quota_gate.first_fit`) or held; whenever a release lowers a quota tree's usage,
the held jobs of that tree are let through in fair order (:func:`~gangline.core.quota_gate.let_through`).
Fair shares are the charged usage and its decayed history (half-life), advanced at every charge change
with the time of the change, as the quota service keeps them. The core's simulator runs it
(``gangline.sim.gated``); placement places only jobs let through (the open cycle of
:func:`~gangline.core.actions.queueing.placement_cycle`).

Pure: times are given (seconds on the caller's clock), nothing is read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from gangline.core.fairshare import FairShare, Pending, UsageHistory, advance
from gangline.core.gate_credit import CreditPolicy, credit_left, lend
from gangline.core.model import Job, JobId, QueueName
from gangline.core.queues import QuotaLedger, QuotaTree, Resource
from gangline.core.quota_gate import Flavour, first_fit, let_through

DEFAULT_HALF_LIFE_S = 3600.0
"""Fair share's usage half-life unless configured (the quota service's default)."""


@dataclass(frozen=True, slots=True)
class Charge:
    """What the ledger holds for a job: its queue and the flavour it was let through on."""

    queue: QueueName
    flavour: Flavour


class QuotaCharges:
    """The quota gate with charges from let-through to release (see the module docstring).

    Only jobs of the tree's queues are its business: the caller sends the others straight to placement
    (a queue the configuration does not limit). ``flavours`` gives a job's flavours its nodes can hold,
    in the order to try them (none: it waits, uncharged, until they can).
    """

    def __init__(
        self,
        tree: QuotaTree,
        flavours: Callable[[Job], Sequence[Flavour]],
        *,
        half_life_s: float = DEFAULT_HALF_LIFE_S,
        credit: CreditPolicy | None = None,
        starvation_s: float | None = None,
    ) -> None:
        self.tree = tree
        self.credit = credit
        self.starvation_s = starvation_s
        """A held job admitted longer ago than this goes ahead of fair order, oldest first (None: never)."""
        self.ledger = QuotaLedger(tree)
        self.half_life_s = half_life_s
        self.history = UsageHistory(as_of=0.0)
        self._flavours = flavours
        self._queues = [QueueName(q) for q in tree.queue_names()]
        self._tree_queues: dict[str, list[QueueName]] = {}
        for q in self._queues:
            self._tree_queues.setdefault(tree.root_cohort_of(q), []).append(q)
        self._capacity = {r: tree.total_nominal(r) for r in sorted(tree.resources)}
        self.charges: dict[JobId, Charge] = {}
        self.held: dict[str, dict[JobId, Pending[Job]]] = {}
        """Jobs waiting at the gate (nothing charged), per quota tree (its root's name)."""
        self.unplaced: dict[JobId, Charge] = {}
        """Charged and not placed yet (:meth:`placed`): what the gate's backfill lends."""
        self.lent: dict[JobId, Charge] = {}
        """Let through on credit (:mod:`gangline.core.gate_credit`), not charged, until released."""
        self._lent_from: dict[JobId, tuple[str, Pending[Job]]] = {}

    def limits(self, queue: str) -> bool:
        """Whether ``queue``'s jobs are charged here (a queue of the tree)."""
        return self.tree.has_queue(queue)

    def arrive(self, job: Job, admitted_at: float, at: float) -> Flavour | None:
        """A job admitted (or requeued, keeping its admitted time): charged and let through on the first
        flavour its queue's quota admits now, or held (None)."""
        fit = first_fit(self.ledger, job.queue, self._flavours(job))
        if fit is not None:
            self._charge(job, fit, at)
            return fit
        root = self.tree.root_cohort_of(job.queue)
        self.held.setdefault(root, {})[job.id] = Pending(job.queue, job.priority, admitted_at, job.id, job)
        return None

    def release(self, job_id: JobId, at: float) -> str | None:
        """The job's allocation was released (or it ended): its charge goes. The tree whose usage it
        lowered (None: nothing was charged)."""
        self.unplaced.pop(job_id, None)
        loan = self.lent.pop(job_id, None)
        if loan is not None:
            self._lent_from.pop(job_id, None)
            return self.tree.root_cohort_of(loan.queue)
        charge = self.charges.pop(job_id, None)
        if charge is None:
            return None
        self._advance(at)
        if charge.flavour.request:
            self.ledger.release(charge.queue, charge.flavour.request)
        return self.tree.root_cohort_of(charge.queue)

    def let_through(self, root: str, at: float) -> list[tuple[Job, Flavour]]:
        """Usage in tree ``root`` dropped: its held jobs in fair order, each charged while it fits."""
        held = self.held.get(root)
        if not held:
            return []
        gate = let_through(
            list(held.values()),
            self.ledger.copy(),
            self.fair_share(root, at),
            self.tree,
            lambda job: (self._flavours(job), ()),
            explain=0,
            aged_before=self._aged_before(at),
        )
        for job, fit in gate.admitted:
            del held[job.id]
            self._charge(job, fit, at)
        return gate.admitted

    def placed(self, job_id: JobId) -> None:
        """Placement placed the job: its charge stands for running GPUs now, and is lent no more."""
        self.unplaced.pop(job_id, None)

    def lend(self, at: float, exclude: AbstractSet[JobId] = frozenset()) -> list[tuple[Job, Flavour]]:
        """After placement's try: held jobs (but ``exclude``) let through on what is charged to jobs still
        unplaced (:func:`gangline.core.gate_credit.lend`), tree by tree; nothing without a credit policy.
        A job lent to that placement does not place at once is handed back (:meth:`unlend`)."""
        if self.credit is None or not self.unplaced:
            return []
        out: list[tuple[Job, Flavour]] = []
        root_of = self.tree.root_cohort_of
        for root in sorted(self.held):
            held = self.held[root]
            if not held:
                continue
            credit = credit_left(
                (c.flavour.request for c in self.unplaced.values() if root_of(c.queue) == root),
                (c.flavour.request for c in self.lent.values() if root_of(c.queue) == root),
            )
            if not credit:
                continue
            candidates = held.values() if not exclude else [p for p in held.values() if p.tie not in exclude]
            fair = self.fair_share(root, at)
            aged = self._aged_before(at)
            for job, fit in lend(candidates, credit, fair, self._flavours, self.credit, aged_before=aged):
                self._lent_from[job.id] = (root, held.pop(job.id))
                self.lent[job.id] = Charge(job.queue, fit)
                out.append((job, fit))
        return out

    def unlend(self, job_id: JobId) -> None:
        """A job lent credit that placement could not place: back to the gate's held jobs, its credit
        back to lend again."""
        if self.lent.pop(job_id, None) is None:
            return
        root, pending = self._lent_from.pop(job_id)
        self.held.setdefault(root, {})[job_id] = pending

    def _aged_before(self, at: float) -> float | None:
        return at - self.starvation_s if self.starvation_s is not None else None

    def fair_share(self, root: str, at: float) -> FairShare:
        """Dominant shares of the tree's queues: charged usage now, and the history decayed to ``at``."""
        queues = self._tree_queues.get(root, [])
        history: UsageHistory | None = None
        if self.half_life_s > 0:
            now = max(self.history.as_of, at)
            history = advance(self.history, self._allocation(), now=now, half_life_s=self.half_life_s)
        return FairShare(
            capacity=self._capacity,
            weights={q: self.tree.weight(q) for q in queues},
            allocation=self._allocation(queues),
            history=history,
        )

    def _charge(self, job: Job, flavour: Flavour, at: float) -> None:
        self._advance(at)
        if flavour.request:
            self.ledger.admit(job.queue, flavour.request)
        self.charges[job.id] = self.unplaced[job.id] = Charge(job.queue, flavour)

    def _advance(self, at: float) -> None:
        """Move the decayed usage to ``at`` with what was charged until now (never backwards)."""
        now = max(self.history.as_of, at)
        if self.half_life_s <= 0:
            self.history = UsageHistory(as_of=now)
            return
        self.history = advance(self.history, self._allocation(), now=now, half_life_s=self.half_life_s)

    def _allocation(self, queues: Sequence[QueueName] | None = None) -> dict[QueueName, dict[Resource, int]]:
        chosen = self._queues if queues is None else queues
        return {q: v for q in chosen if (v := self.ledger.usage_vector(q))}
