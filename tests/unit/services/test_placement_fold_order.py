"""Placement's state is the same whatever order the partitions were folded in, and folding a fact
again changes nothing: what makes a restore followed by the live poll (which reads part of the log
again) and a replay of the log decide alike."""

from __future__ import annotations

import itertools

from svc_helpers import cluster, env
from test_placement import TOPICS

from gangline.core.defaults import default_profile
from gangline.events.base import Envelope
from gangline.events.jobs import JobAdmitted, JobSpec
from gangline.events.nodes import GpuHealthChanged
from gangline.events.types import JobId
from services.placement.handlers import PlacementState, end_batch


def _state(events: list[Envelope]) -> PlacementState:
    state = PlacementState(topics=TOPICS, profile=default_profile(), gated=False)
    for envelope in events:
        state.fold(envelope)
    return state


def _failed(node: str, gpu: str, *, at: float) -> Envelope:
    return env(
        GpuHealthChanged.model_validate(
            {
                "node": node,
                "gpu": gpu,
                "previous": "healthy",
                "state": "failed",
                "cause": {"kind": "xid", "message": "XID 79: fell off the bus", "xid": 79},
            }
        ),
        at=at,
    )


def _unusable(state: PlacementState) -> dict[str, set[str]]:
    return {n: set(g) for n, g in state.failed_gpus.items() if g}


def test_a_registration_read_again_does_not_undo_a_later_gpu_failure() -> None:
    [node] = [env(n, at=0) for n in cluster(("a", 1, 8)).registrations()]
    failed = _failed("a-0", "gpu3", at=5)

    # The restore folds the inventory, then the health topic; the live poll reads the registration again.
    state = _state([node, failed, node])

    assert _unusable(state) == {"a-0": {"gpu3"}}


def test_a_re_registration_after_a_failure_resets_the_gpu_in_either_order() -> None:
    [first] = [env(n, at=0) for n in cluster(("a", 1, 8)).registrations()]
    [again] = [env(n, at=10) for n in cluster(("a", 1, 8)).registrations()]
    failed = _failed("a-0", "gpu3", at=5)

    for order in itertools.permutations([failed, again]):
        assert _unusable(_state([first, *order])) == {}


def test_waiting_jobs_are_decided_in_the_same_order_whatever_order_they_were_folded_in() -> None:
    nodes = [env(n) for n in cluster(("a", 1, 8)).registrations()]
    jobs = [
        env(JobAdmitted(job_id=JobId(name), spec=JobSpec(queue="q", workers=1, gpus_per_worker=4)), at=at)
        for name, at in (("late", 3.0), ("early", 1.0), ("same-b", 2.0), ("same-a", 2.0))
    ]
    placed = set()
    for order in itertools.permutations(jobs):
        state = _state([*nodes, *order])
        state.cycle_due = True
        outputs = end_batch(state, cause="c", now=nodes[0].time)
        placed.add(tuple(e.subject for _, e in outputs if e.type == "gangline.allocation.granted.v1"))

    # Two 4-GPU jobs fit: the earliest admitted, then the tie at t=2 broken by job id.
    assert placed == {("early", "same-a")}


def test_two_live_grants_of_one_gpu_mirror_the_newer_whatever_order_they_were_read_in() -> None:
    """x held gpu0..3 and was released (on a partition not read yet); y was granted gpu0..1 since."""
    from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
    from gangline.events.types import AllocationId, GpuId, NodeId, QueueName

    [node] = [env(n, at=0) for n in cluster(("a", 1, 8)).registrations()]
    admitted = [
        env(JobAdmitted(job_id=JobId(j), spec=JobSpec(queue="default", workers=1, gpus_per_worker=g)), at=0)
        for j, g in (("x", 4), ("y", 2))
    ]

    def granted(job: str, gpus: int, at: float) -> Envelope:
        placement = Placement(rank=0, node=NodeId("a-0"), gpus=tuple(GpuId(f"gpu{k}") for k in range(gpus)))
        event = AllocationGranted(
            job_id=JobId(job),
            allocation_id=AllocationId(f"{job}.1"),
            queue=QueueName("default"),
            placements=(placement,),
        )
        return env(event, at=at)

    older, newer = granted("x", 4, at=1), granted("y", 2, at=5)
    for grants in itertools.permutations([older, newer]):
        snapshot = _state([node, *admitted, *grants]).snapshot()
        assert sorted(snapshot.running) == ["y"], grants
        assert sum(sum(per_node) for per_node in snapshot.free) == 6
        # The same when the snapshot was built before the grants were read (as a service that planned
        # in between has it), and once x's release is read too: y holds its two GPUs.
        state = _state([node, *admitted])
        state.snapshot()
        for envelope in grants:
            state.fold(envelope)
        assert sorted(state.snapshot().running) == ["y"], grants
        state.fold(
            env(
                AllocationReleased(job_id=JobId("x"), allocation_id=AllocationId("x.1"), reason="completed"),
                at=4,
            )
        )
        assert sorted(state.snapshot().running) == ["y"]
        assert sum(sum(per_node) for per_node in state.snapshot().free) == 6
