"""Placement and preemption carry out elastic resizes (the handlers driven directly, the fair profile).

One node of 8 GPUs; the elastic job runs 2 GPUs a worker, 1..4 workers. A shrink is preemption's (for a
job placement left pending), a grow placement's (idle GPUs, nothing waiting); either is asked with
``job.resizing`` and finished by preemption on the agent's ``job.checkpointed`` (or at the deadline):
``allocation.released`` ``resized`` and the grant at the new size, one transaction.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from svc_helpers import T0, admitted, cluster, env
from test_preemption import pending

from gangline.core.actions.queueing import PreemptionPolicy
from gangline.core.defaults import placement_registry
from gangline.core.framework.profile import load_profile_file
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope
from gangline.events.jobs import JobCheckpointed, JobCompleted, JobResizing
from gangline.events.nodes import GpuHealthChanged, HealthCause
from gangline.events.types import AllocationId, JobId, NodeId
from services.common.topics import TopicNames
from services.placement.handlers import PlacementState
from services.placement.handlers import decide as place
from services.preemption.handlers import PreemptionState, decide

TOPICS = TopicNames()
FAIR = load_profile_file(
    Path(__file__).resolve().parents[3] / "deploy" / "profiles" / "fair.yaml", placement_registry()
)


def setup(*, min_runtime_s: float = 0.0) -> tuple[PlacementState, PreemptionState]:
    placement = PlacementState(topics=TOPICS, profile=FAIR, gated=False)
    preemption = PreemptionState(
        mirror=PlacementState(topics=TOPICS, profile=FAIR, gated=False),
        policy=PreemptionPolicy(min_runtime_s=min_runtime_s, default_grace_s=0.0, grow_in_cycle=False),
    )
    for node in cluster(("a", 1, 8)).registrations():
        placement.restore(env(node))
        preemption.restore(env(node))
    return placement, preemption


def feed(
    placement: PlacementState, preemption: PreemptionState, envelope: Envelope, at: float
) -> list[Envelope]:
    """One event to both services, then each one's outputs to the other, to the end; all they wrote."""
    now = T0 + timedelta(seconds=at)
    written: list[Envelope] = []
    todo: list[tuple[Envelope, str]] = [(envelope, "")]
    while todo:
        event, by = todo.pop(0)
        for name, handle, state in (("placement", place, placement), ("preemption", decide, preemption)):
            if by != name:  # a service folded its own outputs already
                outs = [o for _, o in handle(event, state, now=now)]  # type: ignore[operator]
                written += outs
                todo += [(o, name) for o in outs]
    return written


def checkpointed(resize: JobResizing, at: float) -> Envelope:
    ack = JobCheckpointed(
        job_id=resize.job_id, allocation_id=resize.allocation_id, node=NodeId("a-0"), checkpoint="ckpt://el"
    )
    return env(ack, at=at)


def elastic() -> Envelope:
    return admitted("el", workers=4, min_workers=1, gpus_per_worker=2, checkpoint_grace_s=30)


def of(written: list[Envelope], kind: type) -> list:  # type: ignore[type-arg]
    return [e.data for e in written if isinstance(e.data, kind)]


def test_a_shrink_is_asked_then_done_on_the_checkpoint_and_the_waiting_job_is_placed() -> None:
    placement, preemption = setup()
    [grant] = of(feed(placement, preemption, elastic(), at=0), AllocationGranted)
    assert grant.workers == 4
    written = feed(placement, preemption, admitted("urgent", gpus_per_worker=4, priority=5), at=10)
    [resize] = of(written, JobResizing)
    assert (resize.from_workers, resize.to_workers, resize.preemptor_job_id) == (
        4,
        2,
        "urgent",
    )  # all it needs
    assert resize.deadline == T0 + timedelta(seconds=40) and not of(written, AllocationGranted)
    assert of(feed(placement, preemption, pending("urgent"), at=11), JobResizing) == []  # asked once
    written = feed(placement, preemption, checkpointed(resize, at=12), at=12)
    releases, grants = of(written, AllocationReleased), of(written, AllocationGranted)
    assert [(r.allocation_id, r.reason) for r in releases] == [("el.1", "resized")]
    assert [(g.job_id, g.workers, g.resizes) for g in grants][:2] == [("el", 2, "el.1"), ("urgent", 1, None)]
    el_gpus = {g for p in grants[0].placements for g in p.gpus}
    assert not el_gpus & {g for p in grants[1].placements for g in p.gpus}
    assert el_gpus == {g for p in resize.placements for g in p.gpus}


def test_a_job_younger_than_the_minimum_runtime_is_not_shrunk() -> None:
    placement, preemption = setup(min_runtime_s=300)
    feed(placement, preemption, elastic(), at=0)
    written = feed(placement, preemption, admitted("urgent", gpus_per_worker=4, priority=5), at=10)
    assert of(written, JobResizing) == []
    [resize] = of(feed(placement, preemption, pending("urgent"), at=400), JobResizing)
    assert resize.to_workers == 2


def test_a_grow_onto_a_gpu_that_failed_meanwhile_comes_back_at_its_old_size() -> None:
    placement, preemption = setup()
    feed(placement, preemption, admitted("big", gpus_per_worker=6, duration_hint_s=60), at=0)
    [grant] = of(feed(placement, preemption, elastic(), at=1), AllocationGranted)
    assert grant.workers == 1
    done = JobCompleted(job_id=JobId("big"), allocation_id=AllocationId("big.1"))
    written = feed(placement, preemption, env(done, at=60), at=60)
    [resize] = of(written, JobResizing)
    assert (resize.from_workers, resize.to_workers) == (1, 4)
    extra = next(g for p in resize.placements for g in p.gpus if g not in grant.placements[0].gpus)
    failed = GpuHealthChanged(
        node=NodeId("a-0"),
        gpu=extra,
        previous="healthy",
        state="failed",
        cause=HealthCause(kind="xid", xid=79, message="XID 79"),
    )
    feed(placement, preemption, env(failed, at=61), at=61)
    written = feed(placement, preemption, checkpointed(resize, at=62), at=62)
    [again] = [g for g in of(written, AllocationGranted) if g.job_id == "el"]
    assert again.resizes == grant.allocation_id and again.placements == grant.placements
