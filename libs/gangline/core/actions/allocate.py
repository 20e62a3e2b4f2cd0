"""allocate: place each open job whole, in order, or leave it pending with its reasons.

For each job: pre-filters, the gang search (`gangline.core.placement`), scores, then the best
candidate is reserved, permitted and taken in the working snapshot, so the next job sees it.
Gangs are never partly placed, so two gangs that cannot both fit never deadlock: the first in
order is placed whole and the other waits.

Ties between equal scores go to the earlier candidate (search order), so the plan is
deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping

from gangline.core.explain import explain_unplaced
from gangline.core.framework.cycle import Session
from gangline.core.framework.state import Candidate, CycleState
from gangline.core.framework.status import Reason, ReasonCode, Status, StatusCode
from gangline.core.model import GpuMode, Job
from gangline.core.placement import search, whole_workers_fit

NAME = "allocate"


def placement_reasons(
    state: CycleState, job: Job, candidate: Candidate, total: int, parts: Mapping[str, int]
) -> tuple[Reason, ...]:
    """Why this placement: where it landed and each plugin's score."""
    snap = state.snapshot
    if candidate.level is not None and candidate.domain is not None:
        where = f"{candidate.level.label} {snap.domain_name(candidate.level, candidate.domain)}"
    else:
        where = "best-fit nodes"
    nodes = [snap.nodes[i].id for i in candidate.nodes]
    shown = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
    placed = Reason(
        ReasonCode.PLACED,
        NAME,
        f"{len(candidate.slots)} worker(s) on {shown} ({where})",
        {"workers": len(candidate.slots), "nodes": len(nodes), "model": snap.models[candidate.model]},
    )
    score = Reason(ReasonCode.SCORE, NAME, f"score {total}", {k: parts[k] for k in sorted(parts)})
    return (placed, score)


def choose(
    session: Session, state: CycleState, job: Job, candidates: list[Candidate]
) -> tuple[int, int, dict[str, int]]:
    """Index, total and per-plugin scores of the best candidate (earliest wins ties)."""
    best: tuple[int, int, dict[str, int]] = (0, -1, {})
    for k, c in enumerate(candidates):
        total, parts = session.score(state, job, c)
        if total > best[1]:
            best = (k, total, parts)
    return best


def allocate_one(session: Session, job: Job) -> Status:
    """Try to place one job now; records the decision in the session."""
    snap = session.snapshot
    if (
        not session.explain
        and job.kind is GpuMode.WHOLE
        and whole_workers_fit(snap, range(len(snap.models)), job.gpus_per_worker) < job.fewest_workers
    ):
        # Without the why, a gang the free GPUs cannot hold waits (UNSCHEDULABLE) without its
        # pre-filters: no search could place it. One a pre-filter would call UNRESOLVABLE is then
        # only tried again by backfill, and fails again.
        st = Status(StatusCode.UNSCHEDULABLE, ())
        session.pend(job, st)
        return st
    state = session.new_state(job)
    st = session.pre_filter(state, job)
    if not st.ok:
        session.pend(job, st)
        return st
    result = search(session, state, job)
    if not result.candidates:
        st = explain_unplaced(state, job, result) if session.explain else Status(StatusCode.UNSCHEDULABLE, ())
        session.pend(job, st)
        return st
    k, total, parts = choose(session, state, job, result.candidates)
    candidate = result.candidates[k]
    reasons = placement_reasons(state, job, candidate, total, parts)
    st = session.place(state, job, candidate, reasons, score=total)
    if not st.ok:
        session.pend(job, st)
    return st


class Allocate:
    """See module docstring."""

    name = NAME

    def __init__(self, args: Mapping[str, object] | None = None) -> None:
        del args

    def execute(self, session: Session) -> None:
        """Place every open job that fits, in session order."""
        for job in session.open_jobs():
            allocate_one(session, job)
