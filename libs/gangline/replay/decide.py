"""Re-running placement decisions from recorded inputs, and checking them against the log (pure).

`PlacementModel` is the placement decision as a fold over the log: it reads the inputs —
`node.registered` (nodes.inventory), `job.requested` / `job.cancel_requested` (jobs.requests) and
`allocation.released` (allocations.log: completions, failures and preemptions as the scheduler's
services wrote them) — and after each input that changes its state it runs one core cycle over the
waiting jobs (in request order) and returns the `allocation.granted` payloads the cycle decides.
Cycle numbers count the cycles run, so allocation ids (`<job>.c<cycle>`, `wire_allocation_id`;
the core's default `<job>@<cycle>` is not a valid wire id) are reproducible.

`replay_decisions` walks a log in order, feeds every input to the model and checks that each
recorded `allocation.granted` equals the next decision the model made (payloads compared as
canonical JSON); a difference, a grant nobody decided, or a decision never recorded is named.
This is the contract the placement service follows so that `gangline replay --verify` holds.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from gangline.core.defaults import default_profile
from gangline.core.framework.cycle import apply_plan, run_cycle
from gangline.core.framework.plan import Placed
from gangline.core.framework.profile import Profile
from gangline.core.model import AllocationId, Job, JobId, Node, NodeId
from gangline.core.snapshot import Snapshot
from gangline.events.base import JsonObject
from gangline.events.codec import dumps
from gangline.events.jobs import JobRequested
from gangline.events.nodes import NodeRegistered
from gangline.fold.adapter import core_job, core_node, wire_placements
from gangline.replay.log import LogRecord

GRANTED = "gangline.allocation.granted.v1"
RELEASED = "gangline.allocation.released.v1"
REQUESTED = "gangline.job.requested.v1"
CANCEL = "gangline.job.cancel_requested.v1"
REGISTERED = "gangline.node.registered.v1"


def wire_allocation_id(job_id: JobId, cycle: int) -> AllocationId:
    """`<job>.c<cycle>`: deterministic and valid on the wire (letters, digits, '.', '_', '-')."""
    return AllocationId(f"{job_id}.c{cycle}")


def node_from_registration(data: JsonObject) -> Node:
    """The core `Node` of a `node.registered` payload, as the services see it (every GPU usable)."""
    return core_node(NodeRegistered.model_validate(data), cordoned=False, unusable_gpus=frozenset())


def granted_payload(placed: Placed, snapshot: Snapshot) -> JsonObject:
    """The `allocation.granted` data of a placed job."""
    a = placed.allocation
    first = a.placements[0]
    model = snapshot.models[snapshot.g_model[snapshot.gpu_pos[first.gpus[0]]]]
    return {
        "job_id": placed.job.id,
        "allocation_id": a.id,
        "queue": placed.job.queue,
        "gpu_type": model,
        "placements": [p.model_dump(mode="json") for p in wire_placements(a)],
        "resizes": None,  # this model places jobs; it never resizes one
    }


@dataclass
class PlacementModel:
    """Placement as a fold over the log (see module docstring)."""

    profile: Profile = field(default_factory=default_profile)
    nodes: dict[NodeId, Node] = field(default_factory=dict)
    pending: dict[JobId, Job] = field(default_factory=dict)
    cycle: int = 0
    snapshot: Snapshot = field(default_factory=lambda: Snapshot([]))

    def step(self, record: LogRecord) -> list[JsonObject]:
        """Apply one input; the grants decided because of it (none for outputs and other events)."""
        t = record.type
        data = record.envelope.get("data")
        if not isinstance(data, dict):
            return []
        if t == REGISTERED:
            node = node_from_registration(data)
            self.nodes[node.id] = node
            running = list(self.snapshot.running.values())
            self.snapshot = Snapshot.build(list(self.nodes.values()), running)
        elif t == REQUESTED:
            try:
                request = JobRequested.model_validate(data)
            except ValueError:
                return []  # a request admission rejected (workers 0, no queue, ...): never placed
            job = core_job(request.job_id, request)
            if job.id in self.pending or job.id in self.snapshot.running:
                return []  # a duplicate request (idempotency by job id)
            self.pending[job.id] = job
        elif t == CANCEL:
            if self.pending.pop(JobId(data["job_id"]), None) is None:
                return []
            return []
        elif t == RELEASED:
            if self.snapshot.release(JobId(data["job_id"])) is None:
                return []
        else:
            return []
        return self._cycle() if self.pending else []

    def _cycle(self) -> list[JsonObject]:
        self.cycle += 1
        plan = run_cycle(
            self.snapshot,
            list(self.pending.values()),
            self.profile,
            cycle=self.cycle,
            allocation_id=wire_allocation_id,
        )
        apply_plan(self.snapshot, plan)
        out: list[JsonObject] = []
        for p in plan.placed:
            if p.job.id in self.snapshot.running:
                self.pending.pop(p.job.id, None)
                out.append(granted_payload(p, self.snapshot))
        return out


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A recorded output that differs from the replayed decision (or has no counterpart)."""

    where: str
    event_id: str
    message: str


@dataclass
class DecisionReport:
    """How many decisions were replayed and compared, and every mismatch."""

    inputs: int = 0
    decisions: int = 0
    compared: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _diff(recorded: JsonObject, replayed: JsonObject) -> str:
    keys = sorted(set(recorded) | set(replayed))
    parts = [
        f"{k}: recorded {json.dumps(recorded.get(k))[:120]} vs replayed {json.dumps(replayed.get(k))[:120]}"
        for k in keys
        if dumps(recorded.get(k)) != dumps(replayed.get(k))
    ]
    return "; ".join(parts)


def replay_decisions(records: Iterable[LogRecord], model: PlacementModel | None = None) -> DecisionReport:
    """Re-run every decision from the log's inputs and compare with the recorded grants (in log order)."""
    m = model or PlacementModel()
    rep = DecisionReport()
    expected: deque[JsonObject] = deque()
    for r in records:
        if r.type == GRANTED:
            data = r.envelope.get("data")
            if not isinstance(data, dict):
                rep.mismatches.append(Mismatch(r.where, r.event_id, f"record {r.where} has no data"))
                continue
            if not expected:
                rep.mismatches.append(
                    Mismatch(
                        r.where,
                        r.event_id,
                        f"record {r.where} ({r.event_id}) grants {data.get('job_id')}; replay decided none",
                    )
                )
                continue
            want = expected.popleft()
            rep.compared += 1
            if dumps(want) != dumps(data):
                rep.mismatches.append(
                    Mismatch(
                        r.where,
                        r.event_id,
                        f"record {r.where} ({r.event_id}) differs from the replayed decision: "
                        f"{_diff(data, want)}",
                    )
                )
            continue
        decided = m.step(r)
        if r.type in (REQUESTED, CANCEL, RELEASED, REGISTERED):
            rep.inputs += 1
        rep.decisions += len(decided)
        expected.extend(decided)
    for want in expected:
        rep.mismatches.append(
            Mismatch(
                "-",
                "",
                f"replay granted {want['job_id']} ({want['allocation_id']}); the log has no such record",
            )
        )
    return rep
