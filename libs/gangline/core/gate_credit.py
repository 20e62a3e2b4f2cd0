"""Backfill at the quota gate: the quota charged to jobs placement cannot place yet, lent to short jobs.

Quota is charged when the gate lets a job through (:mod:`gangline.core.charging`, docs/charge-point.md),
so a gang charged and waiting for GPUs of the right shape holds quota that no GPU is running for. When
a cohort's quota adds up to its GPUs, the GPUs that gang cannot use yet sit idle while jobs that would
fit them are held at the gate: on the first 8,000 contended Philly jobs, 80% of the time work waits a
held job fits the free GPUs, and about as many GPUs are charged to unplaced jobs as are free.

The rule here is EASY backfill's, one stage earlier. After placement has had its try, what is charged
to jobs still not placed (``unplaced``) is credit; credit already lent (``lent``) is taken off it. A
held job may go through on that credit, in fair order, when

* it has a known end (:attr:`~gangline.core.model.Job.run_bound_s`, the smaller of its time limit and
  duration hint) no later than ``window_s`` from now, and
* what it asks (its first flavour whose model the credit holds) fits the credit left.

A job let through on credit is not charged to the ledger: the charges, and what reclaim and borrowing
read, stay exactly what they were; it holds its credit until its allocation is released. Placement
then treats it as any job let through: its reservation for the blocked gang and its ``backfill``
action keep it off the gang's GPUs unless it ends before the gang's start, so the gang loses nothing
it was promised, and the credit is never more than the GPUs the unplaced charges stand for.

Pure: times are given; nothing is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from gangline.core.fairshare import FairOrder, FairShare, Pending
from gangline.core.queues import Resource
from gangline.core.quota_gate import Flavour

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CreditPolicy:
    """Knobs of the gate's backfill (off where a caller has none)."""

    window_s: float
    """Longest run bound a job may have to go through on credit (seconds)."""


def credit_left(
    unplaced: Iterable[Mapping[Resource, int]], lent: Iterable[Mapping[Resource, int]]
) -> dict[Resource, int]:
    """What the unplaced charges stand for, less what is lent already, per resource (none below 0)."""
    left: dict[Resource, int] = {}
    for request in unplaced:
        for r, n in request.items():
            left[r] = left.get(r, 0) + n
    for request in lent:
        for r, n in request.items():
            if r in left:
                left[r] -= n
    return {r: n for r, n in left.items() if n > 0}


def _fits(request: Mapping[Resource, int], left: Mapping[Resource, int]) -> bool:
    return bool(request) and all(left.get(r, 0) >= n for r, n in request.items())


def lend(
    held: Iterable[Pending[T]],
    credit: Mapping[Resource, int],
    fair: FairShare,
    flavours: Callable[[T], Sequence[Flavour]],
    policy: CreditPolicy,
    *,
    run_bound: Callable[[T], float | None],
    aged_before: float | None = None,
) -> list[tuple[T, Flavour]]:
    """The held jobs that go through on ``credit`` (see the module docstring), in fair order (jobs waiting
    since before ``aged_before`` first: the starvation bound).

    ``fair`` is charged with what is lent (pass a copy to keep the caller's); the jobs are those held at
    the gate, their flavours those the gate tries them on, ``run_bound`` a job's known end (seconds from
    its start; None: unknown, never lent to).
    """
    left = dict(credit)
    if not left:
        return []
    candidates = [h for h in held if (b := run_bound(h.item)) is not None and b <= policy.window_s]
    if not candidates:
        return []
    out: list[tuple[T, Flavour]] = []
    order = FairOrder(candidates, fair, aged_before=aged_before)
    while (p := order.next()) is not None:
        fit = next((f for f in flavours(p.item) if _fits(f.request, left)), None)
        if fit is None:
            order.skipped()
            continue
        for r, n in fit.request.items():
            left[r] -= n
        order.admitted(fit.request)
        out.append((p.item, fit))
        if not any(n > 0 for n in left.values()):
            break
    return out
