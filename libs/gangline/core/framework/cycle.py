"""One scheduling cycle: a session over a snapshot, actions in profile order, a plan out.

`run_cycle` opens a snapshot transaction, runs the profile's actions, and closes the transaction,
so the caller's snapshot is unchanged afterwards; committing is the caller's choice
(`apply_plan`). Inside the cycle, every placement is taken in the working snapshot at once, so
later jobs of the same cycle see it, and evictions free GPUs for later jobs the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gangline.core.framework.plan import Evicted, Pending, Placed, Plan
from gangline.core.framework.plugin import ReservePlugin
from gangline.core.framework.profile import Profile
from gangline.core.framework.state import Candidate, CycleState, StateKey
from gangline.core.framework.status import Reason, ReasonCode, Status, StatusCode
from gangline.core.model import Allocation, AllocationId, Job, JobId
from gangline.core.snapshot import NodeView, Snapshot

NAME = "framework"

AllocationIds = Callable[[JobId, int], AllocationId]
"""Injected id source: (job id, cycle) → allocation id."""


def default_allocation_id(job_id: JobId, cycle: int) -> AllocationId:
    """A deterministic allocation id: the job id and the cycle that placed it."""
    return AllocationId(f"{job_id}.c{cycle}")


FILTER_REJECTIONS: StateKey[dict[tuple[str, ReasonCode], list[Any]]] = StateKey("framework.filter_rejections")
"""Per job: (plugin, code) → [count, first reason] of filter rejections, for explanations."""


class Session:
    """The working context of one cycle; actions record every decision through it."""

    def __init__(
        self,
        snapshot: Snapshot,
        profile: Profile,
        jobs: Sequence[Job],
        *,
        cycle: int,
        allocation_id: AllocationIds = default_allocation_id,
    ) -> None:
        self.snapshot = snapshot
        self.profile = profile
        self.cycle = cycle
        self.allocation_id = allocation_id
        self.shared: dict[StateKey[Any], Any] = {}
        seen: set[JobId] = set()
        for j in jobs:
            if j.id in seen:
                raise ValueError(f"job {j.id} listed twice in one cycle")
            seen.add(j.id)
        order = profile.orderers
        if order:
            indexed = sorted(
                enumerate(jobs),
                key=lambda ij: (tuple(k for o in order for k in o.job_order_key(ij[1])), ij[0]),
            )
            self.jobs: tuple[Job, ...] = tuple(j for _, j in indexed)
        else:
            self.jobs = tuple(jobs)
        self.placed: dict[JobId, Placed] = {}
        self.pending: dict[JobId, Pending] = {}
        self.evicted: dict[JobId, Evicted] = {}
        self.explain = True
        """Whether waiting jobs get their reasons in full (False: only the status code, which is all
        any action reads; for callers that never show reasons, the simulator)."""
        self.set_aside: set[JobId] = set()
        """Jobs already decided to wait this cycle (holding GPUs being freed for them): actions skip them."""

    # ------------------------------------------------------------ reading

    def open_jobs(self) -> list[Job]:
        """Jobs of this cycle not placed yet (pending ones included, set-aside ones not), in order."""
        running, placed, aside = self.snapshot.running, self.placed, self.set_aside
        return [j for j in self.jobs if j.id not in placed and j.id not in running and j.id not in aside]

    def new_state(self, job: Job) -> CycleState:
        """Fresh per-job state sharing this cycle's shared facts."""
        return CycleState(self.snapshot, self.cycle, self.shared)

    # ------------------------------------------------------------ extension points

    def pre_filter(self, state: CycleState, job: Job) -> Status:
        """Run every pre-filter; the merged failure (all reasons) or success."""
        reasons: list[Reason] = []
        worst = StatusCode.SUCCESS
        for p in self.profile.pre_filters:
            s = p.pre_filter(state, job)
            if not s.ok:
                reasons.extend(s.reasons)
                if worst is not StatusCode.UNRESOLVABLE:
                    worst = s.code
        if worst is StatusCode.SUCCESS:
            return Status.success()
        return Status(worst, tuple(reasons))

    def node_fits(self, state: CycleState, job: Job, node: int) -> bool:
        """Run the filters on a node once per job; rejections are tallied for explanations."""
        cached = state.filter_cache.get(node)
        if cached is not None:
            return cached
        ok = True
        view = NodeView(self.snapshot, node)
        for p in self.profile.filters:
            s = p.filter(state, job, view)
            if not s.ok:
                ok = False
                tally = state.read(FILTER_REJECTIONS)
                if tally is None:
                    tally = {}
                    state.write(FILTER_REJECTIONS, tally)
                for r in s.reasons:
                    entry = tally.setdefault((r.plugin, r.code), [0, r])
                    entry[0] += 1
                break
        state.filter_cache[node] = ok
        return ok

    def score(self, state: CycleState, job: Job, candidate: Candidate) -> tuple[int, dict[str, int]]:
        """Weighted total and per-plugin scores of one candidate."""
        total = 0
        parts: dict[str, int] = {}
        for p, w, name in self.profile.scorers:
            v = p.score(state, job, candidate)
            parts[name] = v
            total += v * w
        return total, parts

    # ------------------------------------------------------------ deciding

    def place(
        self,
        state: CycleState,
        job: Job,
        candidate: Candidate,
        reasons: Sequence[Reason],
        *,
        score: int | None = None,
    ) -> Status:
        """Reserve, permit and take `candidate` for `job`; on failure nothing is held.

        `score` is the candidate's total when the caller already computed it.
        The slots are re-checked against the working snapshot, so no action can grant a GPU or
        MIG position twice.
        """
        snap = self.snapshot
        for s in candidate.slots:
            why = snap.slot_conflict(job, s)
            if why is not None:
                return Status.error(f"candidate for {job.id} is stale: {why}", plugin=NAME)
        done: list[ReservePlugin] = []
        for r in self.profile.reservers:
            st = r.reserve(state, job, candidate)
            if not st.ok:
                for d in reversed(done):
                    d.unreserve(state, job, candidate)
                return st
            done.append(r)
        for p in self.profile.permits:
            st = p.permit(state, job, candidate)
            if not st.ok:
                for d in reversed(done):
                    d.unreserve(state, job, candidate)
                return st
        for s in candidate.slots:
            snap.take(job, s)
        allocation = Allocation(
            id=self.allocation_id(job.id, self.cycle),
            job_id=job.id,
            placements=tuple(snap.placement_of(rank, s) for rank, s in enumerate(candidate.slots)),
        )
        snap.record_running(job, allocation)
        total = score if score is not None else self.score(state, job, candidate)[0]
        self.pending.pop(job.id, None)
        self.placed[job.id] = Placed(job, allocation, total, tuple(reasons))
        return Status.success()

    def pend(self, job: Job, status: Status) -> None:
        """Record that `job` waits, for `status`'s reasons (replaces an earlier record)."""
        self.pending[job.id] = Pending(job.id, status.code, status.reasons)

    def evict(
        self, job_id: JobId, reason: str, *, for_job: JobId | None, reasons: Sequence[Reason] = ()
    ) -> bool:
        """Release a running job in the working snapshot and record the eviction."""
        r = self.snapshot.release(job_id)
        if r is None:
            return False
        self.evicted[job_id] = Evicted(job_id, r.allocation.id, reason, for_job, tuple(reasons))
        return True

    def plan(self) -> Plan:
        """The decisions so far, in decision order."""
        return Plan(
            cycle=self.cycle,
            placed=tuple(self.placed.values()),
            pending=tuple(self.pending.values()),
            evicted=tuple(self.evicted.values()),
        )


def run_cycle(
    snapshot: Snapshot,
    jobs: Sequence[Job],
    profile: Profile,
    *,
    cycle: int,
    allocation_id: AllocationIds = default_allocation_id,
) -> Plan:
    """Run one cycle; the snapshot is left exactly as it was given."""
    with snapshot.transaction():
        session = Session(snapshot, profile, jobs, cycle=cycle, allocation_id=allocation_id)
        for action in profile.actions:
            action.execute(session)
        return session.plan()


def apply_plan(snapshot: Snapshot, plan: Plan) -> list[Status]:
    """Commit a plan: release the evicted, grant the placed; statuses of refused grants."""
    problems: list[Status] = []
    for e in plan.evicted:
        snapshot.release(e.job_id)
    for p in plan.placed:
        st = snapshot.grant(p.job, p.allocation)
        if not st.ok:
            problems.append(st)
    return problems


__all__ = [
    "FILTER_REJECTIONS",
    "AllocationIds",
    "Session",
    "apply_plan",
    "default_allocation_id",
    "run_cycle",
]
