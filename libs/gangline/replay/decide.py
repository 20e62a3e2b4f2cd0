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
from gangline.core.mig import MigProfileName
from gangline.core.model import (
    AllocationId,
    DomainId,
    Gpu,
    GpuId,
    GpuMode,
    GpuModel,
    Job,
    JobId,
    MiB,
    Milli,
    Node,
    NodeId,
    QueueName,
    Seconds,
    TopologyConstraint,
    TopologyLevel,
    TopologyMode,
)
from gangline.core.snapshot import Snapshot
from gangline.events.base import JsonObject
from gangline.events.codec import dumps
from gangline.events.jobs import JobRequested
from gangline.replay.log import LogRecord

GRANTED = "gangline.allocation.granted.v1"
RELEASED = "gangline.allocation.released.v1"
REQUESTED = "gangline.job.requested.v1"
CANCEL = "gangline.job.cancel_requested.v1"
REGISTERED = "gangline.node.registered.v1"


def wire_allocation_id(job_id: JobId, cycle: int) -> AllocationId:
    """`<job>.c<cycle>`: deterministic and valid on the wire (letters, digits, '.', '_', '-')."""
    return AllocationId(f"{job_id}.c{cycle}")


def job_from_request(data: JsonObject) -> Job:
    """The core `Job` of a `job.requested` payload."""
    topo = data.get("topology")
    milli = data.get("gpu_fraction_milli")
    mig = data.get("mig_profile")
    hint = data.get("duration_hint_s")
    return Job(
        id=JobId(data["job_id"]),
        queue=QueueName(data["queue"]),
        workers=int(data["workers"]),
        gpus_per_worker=max(1, int(data.get("gpus_per_worker") or 1)),
        gpu_type=GpuModel(data["gpu_type"]) if data.get("gpu_type") else None,
        gpu_memory_mib=MiB(data["gpu_memory_mib"]) if data.get("gpu_memory_mib") else None,
        mig_profile=MigProfileName(mig) if mig else None,
        gpu_milli=Milli(milli) if milli else None,
        priority=int(data.get("priority") or 0),
        preemptible=bool(data.get("preemptible")),
        checkpoint_grace_s=Seconds(int(data.get("checkpoint_grace_s") or 0)),
        topology=(
            TopologyConstraint(TopologyLevel.parse(topo["level"]), TopologyMode(topo.get("mode", "required")))
            if topo
            else None
        ),
        min_workers=data.get("min_workers"),
        duration_hint_s=Seconds(int(hint)) if hint else None,
    )


def node_from_registration(data: JsonObject) -> Node:
    """The core `Node` of a `node.registered` payload (MIG-enabled GPUs in MIG mode)."""
    node = NodeId(data["node"])
    gpus = tuple(
        Gpu(
            GpuId(g["id"]),
            int(g["index"]),
            GpuModel(g["model"]),
            MiB(int(g["memory_mib"])),
            mode=GpuMode.MIG if g.get("mig_enabled") else GpuMode.WHOLE,
        )
        for g in data.get("gpus", [])
    )
    domain = data.get("nvlink_domain")
    return Node(
        id=node,
        gpus=gpus,
        leaf=DomainId(data["leaf"]),
        spine=DomainId(data["spine"]),
        nvlink_domain=DomainId(domain) if domain and domain != node else None,
    )


def granted_payload(placed: Placed, snapshot: Snapshot) -> JsonObject:
    """The `allocation.granted` data of a placed job."""
    a = placed.allocation
    first = a.placements[0]
    model = snapshot.models[snapshot.g_model[snapshot.gpu_pos[first.gpus[0]]]]
    placements: list[JsonObject] = []
    for p in a.placements:
        entry: JsonObject = {
            "rank": p.rank,
            "node": p.node,
            "gpus": list(p.gpus),
            "mig": {"gpu": p.gpus[0], "profile": p.mig.profile, "instance_id": p.mig.start}
            if p.mig
            else None,
            "gpu_fraction_milli": p.milli,
        }
        placements.append(entry)
    return {
        "job_id": placed.job.id,
        "allocation_id": a.id,
        "queue": placed.job.queue,
        "gpu_type": model,
        "placements": placements,
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
                JobRequested.model_validate(data)
                job = job_from_request(data)
            except (KeyError, TypeError, ValueError):
                return []  # a request admission rejected (workers 0, no queue, ...): never placed
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
