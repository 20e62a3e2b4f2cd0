"""One small Protocol per extension point, and the Action protocol.

A plugin is an object with a `name` and any subset of the methods below; the profile files it
under every extension point it implements. All calls are synchronous and pure: a plugin reads the
`CycleState` (and the snapshot through it), never the clock, the network or a random source.

Order of calls for one job in the allocate action:

1. `pre_filter(state, job)` once per job per cycle; may narrow `state.models` / `state.scope`
   and write facts for later calls. A non-success status stops the job here, with its reasons
   (every pre-filter still runs, so the explanation lists every blocking constraint).
2. `filter(state, job, node)` for nodes the search considers, at most once per node per job per
   cycle (results are cached in the state). Must not depend on other nodes' results.
3. `score(state, job, candidate)` for each whole-gang candidate; returns 0..100 (higher is
   better); the profile weight multiplies it. Must not change any state.
4. `reserve(state, job, candidate)` after the best candidate is chosen, before it is taken in the
   working snapshot; `unreserve` undoes it when a later reserve or permit fails. Both are called
   at most once per job per cycle; unreserve only after a successful reserve.
5. `permit(state, job, candidate)`: success approves; `wait` or unschedulable leaves the job
   pending with the reason (its reservation is undone).

`job_order_key(job)` sorts the cycle's pending jobs (keys of the profile's order plugins are
concatenated; the input order breaks ties).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gangline.core.framework.state import Candidate, CycleState
from gangline.core.framework.status import Status
from gangline.core.model import Job
from gangline.core.snapshot import NodeView

if TYPE_CHECKING:
    from gangline.core.framework.cycle import Session

SortKey = tuple[int | str, ...]


@runtime_checkable
class Plugin(Protocol):
    """Anything with a stable registry name."""

    @property
    def name(self) -> str: ...


@runtime_checkable
class PreFilterPlugin(Protocol):
    """Job-level feasibility before any node is looked at (see module docstring, step 1)."""

    def pre_filter(self, state: CycleState, job: Job) -> Status: ...


@runtime_checkable
class FilterPlugin(Protocol):
    """Can this node host workers of this job? (step 2)"""

    def filter(self, state: CycleState, job: Job, node: NodeView) -> Status: ...


@runtime_checkable
class ScorePlugin(Protocol):
    """How good is this whole-gang candidate, 0..100? (step 3)"""

    def score(self, state: CycleState, job: Job, candidate: Candidate) -> int: ...


@runtime_checkable
class ReservePlugin(Protocol):
    """Book-keeping when a candidate is chosen, and its undo (step 4)."""

    def reserve(self, state: CycleState, job: Job, candidate: Candidate) -> Status: ...

    def unreserve(self, state: CycleState, job: Job, candidate: Candidate) -> None: ...


@runtime_checkable
class PermitPlugin(Protocol):
    """Last word on a chosen candidate (step 5)."""

    def permit(self, state: CycleState, job: Job, candidate: Candidate) -> Status: ...


@runtime_checkable
class JobOrderPlugin(Protocol):
    """Sort key for pending jobs; smaller goes first."""

    def job_order_key(self, job: Job) -> SortKey: ...


@runtime_checkable
class Action(Protocol):
    """One step of a cycle (allocate, backfill, preempt, reclaim), run in profile order.

    An action reads `session.open_jobs()` and the working snapshot, and records decisions only
    through the session (`place`, `pend`, `evict`), so the plan stays consistent.
    """

    @property
    def name(self) -> str: ...

    def execute(self, session: Session) -> None: ...
