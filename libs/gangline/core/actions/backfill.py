"""reserve + backfill: the first blocked large gang holds specific GPUs from its earliest start.

``reserve`` runs before allocate. Walking open jobs in order, the first ``max_reservations``
whole-GPU gangs of at least ``min_gpus`` GPUs that their quota admits but the cluster cannot
place now each get a `Reservation`: running jobs are released in the order they are expected to
end (start + duration hint, or a known end), and the first time the gang fits, that instant is its
earliest start and the placement found is the set of GPUs it holds. Lower-priority preemptible jobs
count as ending now: when the gang fits with only those gone, it does not wait — the reservation
becomes a `PreemptionPlan` (kind ``reserve``) that checkpoints them. The reserved GPUs that are
free now are held in the working snapshot, so allocate cannot give them to anyone.

With ``start_ahead: true`` reserve also starts, in order, the jobs ahead of the first blocked gang
that fit now, so the reservation is computed on the GPUs they leave, as EASY backfill does (the
head of the line is the first job that cannot start); without it, allocate places them after the
reservation is taken and they may only use GPUs it does not hold.

``backfill`` runs after allocate. It lets the held GPUs go and tries each still-waiting job that
may use them: a preemptible job (it will be checkpointed when the reservation is due), or one
whose run bound (``Job.run_bound_s``: the smaller of its time limit and duration hint) ends
before the earliest reservation starts. Then it holds what is left
again, so later actions respect the reservation, and explains the wait: the gang is "waiting for
reservation at t=T"; others are told which GPUs are reserved and until when.

A stream of small jobs therefore cannot starve a large gang: once it is first in line, the GPUs
it needs only go to work that will be out of the way when it starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gangline.core.actions.allocate import allocate_one
from gangline.core.actions.preempt import (
    commit_plan,
    placement_oracle,
    search_victims,
)
from gangline.core.actions.queueing import (
    EarliestStart,
    QueueContext,
    Reservation,
    context_of,
    decisions_of,
    request_for_order,
)
from gangline.core.actions.victims import what_if
from gangline.core.framework.cycle import Session
from gangline.core.framework.state import Candidate, StateKey
from gangline.core.framework.status import Reason, ReasonCode, Status, StatusCode
from gangline.core.model import GpuMode, Job
from gangline.core.placement import whole_workers_fit
from gangline.core.snapshot import RunningJob, Slot, most_over
from gangline.core.waiting import group_key

RESERVE = "reserve"
BACKFILL = "backfill"


@dataclass(frozen=True, slots=True)
class _Held:
    job: Job
    slots: tuple[Slot, ...]


HELD: StateKey[list[_Held]] = StateKey("queueing.reservation_holds")


def _int_arg(args: Mapping[str, object] | None, key: str, default: int) -> int:
    value = (args or {}).get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer")
    return value


def _bool_arg(args: Mapping[str, object] | None, key: str, default: bool) -> bool:
    value = (args or {}).get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false")
    return value


def _hold(session: Session, reservation: Reservation, job: Job) -> list[Slot]:
    """Take the reservation's GPUs that are free now, one slot per GPU, in the working snapshot."""
    snap = session.snapshot
    held: list[Slot] = []
    for g in sorted(reservation.gpu_indexes):
        slot = Slot(snap.g_node[g], (g,))
        if snap.slot_conflict(job, slot) is None:
            snap.take(job, slot)
            held.append(slot)
    return held


class Beyond:
    """:func:`earliest_start`'s answer when the gang fits by none of the ends up to ``until`` and the
    rest are known: its start, if any, is later than ``until`` and finite."""

    __slots__ = ()


BEYOND = Beyond()


def earliest_start(
    session: Session, ctx: QueueContext, job: Job, *, until: float | None = None
) -> tuple[float, Candidate, list[RunningJob]] | Beyond | None:
    """When and where ``job`` could start if running jobs end as expected; None if it never fits.

    Returns the start time, the placement, and the lower-priority preemptible jobs it would take
    when that start is *now*. Running jobs with no known end (no duration hint) count as ending
    after all the others, so the start is ``inf`` when the gang needs their GPUs: the reservation
    still holds the GPUs it will use, as they free up.

    ``until``: the caller reads only a start at or before it, or an unknown (``inf``) one: once every
    running job expected to end by then is released and the gang still does not fit, with only known
    ends left, the search stops there and answers :data:`BEYOND` (a later finite start, or none at all).
    """
    snap = session.snapshot
    memo = ctx.start_memo
    key: tuple[object, ...] | None = None
    if memo is not None and _own_snapshot(session, ctx):
        key = group_key(job)
        hit = memo.get(key)
        if hit is not None and hit.version == snap.version and ctx.now <= hit.valid_until:
            return hit.start, hit.candidate, []
    place = placement_oracle(session)
    now_free: list[RunningJob] = []
    timeline: list[tuple[float, str, RunningJob]] = []
    unknown: list[tuple[float, str, RunningJob]] = []
    evicted, placed, now = session.evicted, session.placed, ctx.now
    evict_in_cycle, in_flight, expected_end = ctx.policy.evict_in_cycle, ctx.in_flight, ctx.expected_end
    for r in snap.running.values():
        rj = r.job
        if rj.id in evicted:
            continue
        if evict_in_cycle and rj.preemptible and rj.priority < job.priority and rj.id not in in_flight:
            now_free.append(r)
            continue
        end = expected_end(rj)
        if end is None and rj.id in placed and rj.run_bound_s is not None:
            end = now + rj.run_bound_s  # started in this cycle (``start_ahead``)
        if end is not None:
            timeline.append((now if now > end else end, rj.id, r))  # max(end, now)
        else:
            unknown.append((ctx.runtime(rj.id), rj.id, r))
    timeline.sort(key=_end_then_id)
    # Jobs with no known end come last, the longest-running first: where the gang will go is then
    # the same cycle after cycle, so the GPUs held for it build up instead of wandering.
    unknown.sort(key=lambda t: (-t[0], t[1]))
    timeline.extend((math.inf, job_id, r) for _, job_id, r in unknown)
    now_free.sort(key=lambda r: r.job.id)
    need = job.fewest_workers * job.gpus_per_worker
    models = (
        [snap.model_pos[job.gpu_type]]
        if job.gpu_type is not None and job.gpu_type in snap.model_pos
        else list(range(len(snap.models)))
    )
    with what_if(snap):
        for r in now_free:
            snap.release(r.job.id)
        if most_over(snap.total_free, models) >= need:
            got = place(job)
            if got is not None:
                return ctx.now, got, now_free
        stop_after = until if until is not None and not unknown else math.inf
        for end, _, r in timeline:
            if end > stop_after:
                return BEYOND  # no fit by ``until``, and every later start is known and later
            snap.release(r.job.id)
            if most_over(snap.total_free, models) < need:
                continue
            if whole_workers_fit(snap, models, job.gpus_per_worker) < job.fewest_workers:
                continue  # not enough of the free GPUs together on nodes: no placement yet
            got = place(job)
            if got is not None:
                if memo is not None and key is not None and not now_free:
                    # Read again at a later `now`, the same search gives the same answer while no
                    # expected end has passed (`max(end, now)` and the release order stay put).
                    soonest = min((t[0] for t in timeline), default=math.inf)
                    if soonest > ctx.now:
                        memo[key] = EarliestStart(end, got, soonest, snap.version)
                return end, got, []
    return None


def _end_then_id(t: tuple[float, str, RunningJob]) -> tuple[float, str]:
    return (t[0], t[1])


def _own_snapshot(session: Session, ctx: QueueContext) -> bool:
    """Whether the working snapshot is still the one the cycle began with (nothing placed, taken,
    evicted or held yet) and no preemption is in flight: `earliest_start` then reads only the
    caller's snapshot and facts, which `QueueContext.start_memo` is kept for."""
    return (
        not session.placed
        and not session.evicted
        and not session.set_aside
        and not session.shared.get(HELD)
        and not ctx.in_flight
        and not ctx.freeing
    )


class Reserve:
    """See module docstring (``reserve``)."""

    name = RESERVE

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        self.max_reservations = _int_arg(args, "max_reservations", 1)
        self.min_gpus = _int_arg(args, "min_gpus", 8)
        self.start_ahead = _bool_arg(args, "start_ahead", False)
        horizon = (args or {}).get("horizon_s")
        if horizon is not None and (
            isinstance(horizon, bool) or not isinstance(horizon, int | float) or horizon < 0
        ):
            raise ValueError("horizon_s must be a non-negative number of seconds")
        self.horizon_s = None if horizon is None else float(horizon)
        """A gang whose earliest start is further off than this holds no GPUs yet (None: any start), unless
        it has waited past the profile's ``starvation_s``: see :func:`beyond_horizon`."""

    def execute(self, session: Session) -> None:
        ctx = context_of(session)
        decisions = decisions_of(session)
        place = placement_oracle(session)
        holds: list[_Held] = session.shared.setdefault(HELD, [])
        made = 0
        for job in session.open_jobs():
            if made >= self.max_reservations:
                break
            if job.kind is not GpuMode.WHOLE or job.fewest_workers * job.gpus_per_worker < self.min_gpus:
                continue
            if job.id in ctx.in_flight or not ctx.ledger.tree.has_queue(job.queue):
                continue
            if not ctx.ledger.fits(job.queue, request_for_order(job, session.snapshot)):
                continue
            if place(job) is not None:
                if self.start_ahead:
                    allocate_one(session, job)
                continue  # else allocate will place it
            found = earliest_start(session, ctx, job, until=self._until(session, ctx, job))
            if isinstance(found, Beyond):
                continue  # beyond the horizon, or it never fits: either way nothing is held for it
            if found is None:
                decisions.explain(job.id, "blocked, and would not fit even on idle GPUs: no reservation")
                continue
            start, candidate, to_preempt = found
            if not to_preempt and beyond_horizon(session, ctx, job, start, self.horizon_s):
                decisions.explain(
                    job.id, f"its earliest start {when(start)} is beyond the reservation horizon"
                )
                continue
            made += 1
            if to_preempt:
                victims = search_victims(session, ctx, job, to_preempt)
                if victims is not None:
                    because = f"preemptible backfill on GPUs reserved for {job.id} (priority {job.priority})"
                    why = {v.job_id: because for v in victims.victims}
                    commit_plan(session, ctx, job, victims, RESERVE, why)
                    continue
            # Its own reasons first (fragmentation, capacity, ...), read before its GPUs are held;
            # allocate then passes it by (backfill hands it back to any later action).
            if allocate_one(session, job).ok:
                continue
            snap = session.snapshot
            reservation = Reservation(
                job_id=job.id,
                start=start,
                placements=tuple(snap.placement_of(k, s) for k, s in enumerate(candidate.slots)),
                gpu_indexes=frozenset(g for s in candidate.slots for g in s.gpus),
            )
            decisions.reservations.append(reservation)
            decisions.explain(
                job.id,
                f"waiting for reservation {when(start)}: {len(reservation.gpu_indexes)} GPUs on "
                f"{len({p.node for p in reservation.placements})} node(s) held for it",
            )
            session.set_aside.add(job.id)
            holds.append(_Held(job, tuple(_hold(session, reservation, job))))

    def _until(self, session: Session, ctx: QueueContext, job: Job) -> float | None:
        """How far ahead ``job``'s earliest start matters to this action, when only its being further
        off than the horizon is read (None: its start is read whatever it is). A cycle that writes why
        jobs wait needs the whole answer: a gang that never fits is told so, not that its start is far."""
        if self.horizon_s is None or ctx.explain or starving(session, ctx, job):
            return None
        return ctx.now + self.horizon_s


def starving(session: Session, ctx: QueueContext, job: Job) -> bool:
    """Whether ``job`` has waited past the profile's ``starvation_s``."""
    starvation = session.profile.settings.starvation_s
    submitted = ctx.submit_time.get(job.id)
    return starvation is not None and submitted is not None and submitted <= ctx.now - starvation


def beyond_horizon(
    session: Session, ctx: QueueContext, job: Job, start: float, horizon_s: float | None
) -> bool:
    """Whether ``job``'s reservation waits: its earliest start is more than ``horizon_s`` away and it has
    not waited past the profile's ``starvation_s`` (a starving gang always holds its GPUs).

    Holding GPUs for a start days away keeps them idle for days, or busy only with work short enough to
    end first; until the start comes near, the GPUs it will use go to any job, and the reservation is
    taken once the start is within the horizon (or the gang starves: then at once, whatever its start).
    An unknown start (``inf``: it waits for jobs with no known end) is not known to be far: the gang
    holds its GPUs as it would without a horizon, or a stream of small jobs with no hints would keep it
    off them until it starves.
    """
    if horizon_s is None or math.isinf(start) or start <= ctx.now + horizon_s:
        return False
    return not starving(session, ctx, job)


class Backfill:
    """See module docstring (``backfill``)."""

    name = BACKFILL

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        del args

    def execute(self, session: Session) -> None:
        ctx = context_of(session)
        decisions = decisions_of(session)
        snap = session.snapshot
        holds: list[_Held] = session.shared.get(HELD, [])
        for h in holds:
            for s in h.slots:
                snap.give_back(h.job.id, s)
        session.shared[HELD] = []
        reservations = decisions.reservations
        if not reservations:
            return
        first_start = min(r.start for r in reservations)
        holders = {r.job_id for r in reservations}
        session.set_aside -= holders
        for job in session.open_jobs():
            pending = session.pending.get(job.id)
            if job.id in holders or pending is None or pending.code is not StatusCode.UNSCHEDULABLE:
                continue
            ends = ctx.now + job.run_bound_s if job.run_bound_s is not None else None
            # When the reservation's start is not known, no end is known to come before it.
            if job.preemptible or (ends is not None and math.isfinite(first_start) and ends <= first_start):
                allocate_one(session, job)
        new_holds: list[_Held] = []
        for r in reservations:
            holder = next((j for j in session.jobs if j.id == r.job_id), None)
            if holder is None:
                continue
            new_holds.append(_Held(holder, tuple(_hold(session, r, holder))))
            reason = Reason(
                ReasonCode.RESERVATION,
                BACKFILL,
                f"waiting for reservation {when(r.start)}",
                {"start": str(r.start), "gpus": len(r.gpu_indexes)},
            )
            prior = session.pending.get(r.job_id)
            reasons = (prior.reasons if prior is not None else ()) + (reason,)
            session.pend(holder, Status(StatusCode.UNSCHEDULABLE, reasons))
        session.shared[HELD] = new_holds
        if not ctx.explain:
            return
        for job in session.open_jobs():
            pending = session.pending.get(job.id)
            if job.id in holders or pending is None or pending.code is not StatusCode.UNSCHEDULABLE:
                continue
            decisions.explain(job.id, _reserved_sentence(reservations, job))


def when(start: float) -> str:
    """A reservation's start in words: ``at t=T``, or that it waits for jobs with no known end."""
    if math.isfinite(start):
        return f"at t={start:g}"
    return "until running jobs with no known end free its GPUs"


def _reserved_sentence(reservations: list[Reservation], job: Job) -> str:
    r = min(reservations, key=lambda r: (r.start, r.job_id))
    if job.preemptible:
        tail = "it did not fit even with them"
    elif job.run_bound_s is None:
        tail = "it has no duration hint or time limit, so it cannot be backfilled"
    elif not math.isfinite(r.start):
        tail = "when they free up is not known, so nothing is backfilled on them"
    else:
        tail = "it would not end before then"
    since = f"from t={r.start:g}" if math.isfinite(r.start) else "until they free up"
    return f"{len(r.gpu_indexes)} GPUs are reserved for {r.job_id} {since}; {tail}"
