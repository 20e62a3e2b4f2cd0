"""What one cycle decided: placements, pending jobs with reasons, evictions.

A plan is a value: the placement service turns it into events (`allocation.granted`,
`job.placed`, `job.pending`, preemption requests) or drops it. `canonical_json()` is the byte-exact
form used to check determinism and replay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gangline.core.framework.status import Reason, StatusCode
from gangline.core.model import Allocation, AllocationId, Job, JobId, WorkerPlacement


def placement_to_wire(p: WorkerPlacement) -> dict[str, object]:
    """`{"rank", "node", "gpus"}` plus `mig` / `milli` when present (DESIGN.md §3)."""
    out: dict[str, object] = {"rank": p.rank, "node": p.node, "gpus": list(p.gpus)}
    if p.mig is not None:
        out["mig"] = {"profile": p.mig.profile, "start": p.mig.start}
    if p.milli is not None:
        out["milli"] = p.milli
    return out


@dataclass(frozen=True, slots=True)
class Placed:
    """A job placed whole: its allocation, its total score and the reasons for the choice."""

    job: Job
    allocation: Allocation
    score: int
    reasons: tuple[Reason, ...]

    def to_wire(self) -> dict[str, object]:
        """JSON-ready form (the `allocation.granted` payload plus score and reasons)."""
        return {
            "job_id": self.job.id,
            "allocation_id": self.allocation.id,
            "placements": [placement_to_wire(p) for p in self.allocation.placements],
            "score": self.score,
            "reasons": [r.to_wire() for r in self.reasons],
        }


@dataclass(frozen=True, slots=True)
class Pending:
    """A job left waiting, with one reason per blocking constraint."""

    job_id: JobId
    code: StatusCode
    reasons: tuple[Reason, ...]

    def to_wire(self) -> dict[str, object]:
        """JSON-ready form (the `job.pending` payload)."""
        return {
            "job_id": self.job_id,
            "code": self.code.value,
            "reasons": [r.to_wire() for r in self.reasons],
        }


@dataclass(frozen=True, slots=True)
class Evicted:
    """A running job to stop (preempt/reclaim), for `for_job` when known."""

    job_id: JobId
    allocation_id: AllocationId
    reason: str
    for_job: JobId | None
    reasons: tuple[Reason, ...] = ()

    def to_wire(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "job_id": self.job_id,
            "allocation_id": self.allocation_id,
            "reason": self.reason,
            "for_job": self.for_job,
            "reasons": [r.to_wire() for r in self.reasons],
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """The decisions of cycle `cycle`, in decision order."""

    cycle: int
    placed: tuple[Placed, ...] = ()
    pending: tuple[Pending, ...] = ()
    evicted: tuple[Evicted, ...] = ()

    def placed_job(self, job_id: JobId) -> Placed | None:
        """The placement of `job_id`, if placed."""
        return next((p for p in self.placed if p.job.id == job_id), None)

    def pending_job(self, job_id: JobId) -> Pending | None:
        """Why `job_id` waits, if it does."""
        return next((p for p in self.pending if p.job_id == job_id), None)

    def to_wire(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "cycle": self.cycle,
            "placed": [p.to_wire() for p in self.placed],
            "pending": [p.to_wire() for p in self.pending],
            "evicted": [e.to_wire() for e in self.evicted],
        }

    def canonical_json(self) -> bytes:
        """Byte-exact JSON: sorted keys, no spaces, UTF-8."""
        return json.dumps(self.to_wire(), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
