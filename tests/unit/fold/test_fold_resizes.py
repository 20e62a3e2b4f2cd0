"""The lifecycle fold and an elastic resize: a grow's extra GPUs are held for its job until the resize is
done; a shrink's kept GPUs are not among those freed for the job it makes room for; a resize grant
starts no attempt and a ``resized`` release ends none."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gangline.events.allocations import AllocationGranted, AllocationReleased, Placement
from gangline.events.base import Envelope, Event, make_envelope
from gangline.events.jobs import JobAdmitted, JobResizing, JobSpec
from gangline.events.nodes import GpuInfo, NodeRegistered
from gangline.events.types import AllocationId, JobId
from gangline.fold.cluster import ClusterFold

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EL, GANG = JobId("el"), JobId("gang")


def env(event: Event, event_id: str, at: float = 0.0) -> Envelope:
    return make_envelope(event, event_id=event_id, source="test", time=T0 + timedelta(seconds=at))


def ranks(*gpus: str) -> tuple[Placement, ...]:
    return tuple(Placement(rank=r, node="n0", gpus=(g,)) for r, g in enumerate(gpus))


def world() -> ClusterFold:
    fold = ClusterFold(gated=False)
    node = NodeRegistered(
        node="n0",
        address="10.0.0.1",
        gpus=tuple(
            GpuInfo(id=f"gpu{i}", index=i, uuid=f"u{i}", model="H100", memory_mib=81_000) for i in range(4)
        ),
        nvlink_domain="n0",
        leaf="l0",
        spine="s0",
    )
    fold.fold(env(node, "node"))
    spec = JobSpec(queue="default", workers=1, min_workers=1, max_workers=4, gpus_per_worker=1)
    fold.fold(env(JobAdmitted(job_id=EL, spec=spec), "admitted"))
    fold.fold(
        env(
            AllocationGranted(
                job_id=EL, allocation_id=AllocationId("el.1"), queue="default", placements=ranks("gpu0")
            ),
            "g1",
            1,
        )
    )
    return fold


def owners(fold: ClusterFold) -> list[str | None]:
    snap = fold.snapshot()
    return [snap.g_owner[snap.gpu_pos[f"n0/gpu{i}"]] for i in range(4)]  # type: ignore[index]


def test_a_grow_holds_its_extra_gpus_until_the_resize_grant() -> None:
    fold = world()
    assert owners(fold) == ["el", None, None, None]
    grow = JobResizing(
        job_id=EL,
        allocation_id=AllocationId("el.1"),
        from_workers=1,
        to_workers=3,
        placements=ranks("gpu0", "gpu1", "gpu2"),
        deadline=T0 + timedelta(seconds=30),
        reason="grows",
    )
    assert not fold.fold(env(grow, "grow", 2))
    assert owners(fold) == ["el", "el", "el", None]  # no other job is granted them meanwhile
    assert fold.resizing_jobs() == {"el"}
    released = AllocationReleased(job_id=EL, allocation_id=AllocationId("el.1"), reason="resized")
    assert not fold.fold(env(released, "r1", 3))
    assert owners(fold) == ["el", "el", "el", None]  # until the grant at the new size is read
    resized = AllocationGranted(
        job_id=EL,
        allocation_id=AllocationId("el.2"),
        queue="default",
        placements=grow.placements,
        resizes=AllocationId("el.1"),
    )
    fold.fold(env(resized, "g2", 3))
    assert owners(fold) == ["el", "el", "el", None]
    record = fold.jobs[EL]
    assert not fold.resizing and record.attempts_granted() == 1 and record.attempts_released() == 0
    assert EL not in fold.waiting and not record.finished


def test_a_shrink_frees_only_the_gpus_it_gives_up_for_the_job_it_makes_room_for() -> None:
    fold = world()
    fold.fold(
        env(AllocationReleased(job_id=EL, allocation_id=AllocationId("el.1"), reason="resized"), "r1", 2)
    )
    four = AllocationGranted(
        job_id=EL,
        allocation_id=AllocationId("el.2"),
        queue="default",
        placements=ranks("gpu0", "gpu1", "gpu2", "gpu3"),
        resizes=AllocationId("el.1"),
    )
    fold.fold(env(four, "g2", 2))
    fold.fold(
        env(
            JobAdmitted(job_id=GANG, spec=JobSpec(queue="default", workers=2, gpus_per_worker=1, priority=5)),
            "gang",
            3,
        )
    )
    shrink = JobResizing(
        job_id=EL,
        allocation_id=AllocationId("el.2"),
        from_workers=4,
        to_workers=1,
        placements=ranks("gpu0"),
        deadline=T0 + timedelta(seconds=30),
        reason="shrinks for gang",
        preemptor_job_id=GANG,
    )
    fold.fold(env(shrink, "shrink", 4))
    assert fold.freeing() == {"gang": frozenset({"n0/gpu1", "n0/gpu2", "n0/gpu3"})}
    assert owners(fold) == ["el"] * 4  # held by the job until the resize is done
    released = AllocationReleased(job_id=EL, allocation_id=AllocationId("el.2"), reason="resized")
    assert not fold.fold(env(released, "r2", 5))  # no room yet: a cycle now must not see them free
    assert owners(fold) == ["el"] * 4
    one = AllocationGranted(
        job_id=EL,
        allocation_id=AllocationId("el.3"),
        queue="default",
        placements=ranks("gpu0"),
        resizes=AllocationId("el.2"),
    )
    assert fold.fold(env(one, "g3", 5))  # the shrink's GPUs are free now
    assert owners(fold) == ["el", None, None, None] and not fold.resizing
