"""Grants and releases of GPUs on allocations.log: the audit log analytics read. Subject: the job id."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, Field, model_validator

from gangline.events.base import MODEL_CONFIG, Event
from gangline.events.types import (
    AllocationIdField,
    GpuIdField,
    JobIdField,
    Label,
    MilliGpuField,
    NodeIdField,
    QueueNameField,
    SecondsField,
)


class MigSlice(BaseModel):
    """A MIG instance on one of the placement's GPUs.

    ``instance_id`` and ``compute_instance_id`` are the ids NVML knows an instance the node registered
    by; ``start`` is the memory slice the instance begins at. Without ids the node takes a free
    instance of the profile (at ``start`` when it knows where its instances sit).
    """

    model_config = MODEL_CONFIG

    gpu: GpuIdField
    profile: Annotated[str, Field(pattern=r"^[1-9][0-9]*g\.[1-9][0-9]*gb(\+[a-z]+)?$")]
    instance_id: Annotated[int, Field(ge=0)] | None = None
    """NVML's GPU-instance id. Grants written before ``start`` existed put the start here."""
    compute_instance_id: Annotated[int, Field(ge=0)] | None = None
    start: Annotated[int, Field(ge=0, le=7)] | None = None


class Placement(BaseModel):
    """Where one rank runs: its node and its GPUs there (or the one GPU its slice / shared slot is on)."""

    model_config = MODEL_CONFIG

    rank: Annotated[int, Field(ge=0)]
    node: NodeIdField
    gpus: Annotated[tuple[GpuIdField, ...], Field(min_length=1)]
    mig: MigSlice | None = None
    gpu_fraction_milli: MilliGpuField | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"rank {self.rank} lists a GPU twice: {list(self.gpus)}")
        if self.mig is not None and self.gpu_fraction_milli is not None:
            raise ValueError(f"rank {self.rank} has both a MIG slice and a GPU fraction")
        if (self.mig is not None or self.gpu_fraction_milli is not None) and len(self.gpus) != 1:
            raise ValueError(f"rank {self.rank}: a MIG slice or GPU fraction lives on exactly one GPU")
        if self.mig is not None and self.mig.gpu != self.gpus[0]:
            raise ValueError(f"rank {self.rank}: MIG slice is on {self.mig.gpu!r}, not on {self.gpus[0]!r}")
        return self

    @property
    def shared(self) -> bool:
        """True when the rank holds a slice or shared slot rather than whole GPUs."""
        return self.mig is not None or self.gpu_fraction_milli is not None

    @property
    def gpu_share(self) -> float:
        """GPUs the rank holds, for accounting: whole GPUs, a shared slot as its fraction, a MIG slice
        as its compute slices out of 7 (``3g.40gb``: 3/7)."""
        if self.gpu_fraction_milli is not None:
            return self.gpu_fraction_milli / 1000
        if self.mig is not None:
            return int(self.mig.profile.split("g.", 1)[0]) / 7
        return float(len(self.gpus))


class AllocationGranted(Event):
    """GPUs granted to a whole gang at once: one placement per worker, ranks 0..W-1.

    A whole GPU appears in at most one placement; slices and shared slots may share a GPU.
    """

    TYPE = "allocation.granted"
    VERSION = 1

    job_id: JobIdField
    allocation_id: AllocationIdField
    queue: QueueNameField
    gpu_type: Label | None = None
    placements: Annotated[tuple[Placement, ...], Field(min_length=1)]
    resizes: AllocationIdField | None = None
    """The allocation this grant replaces at another size (an elastic resize, released ``resized`` in
    the same transaction): the same run of the job, resumed from its checkpoint, not a new attempt."""

    @model_validator(mode="after")
    def _one_gang(self) -> Self:
        ranks = sorted(p.rank for p in self.placements)
        if ranks != list(range(len(self.placements))):
            raise ValueError(
                f"placements must have ranks 0..{len(self.placements) - 1}, each once (got {ranks})"
            )
        seen: dict[tuple[str, str], int] = {}
        for p in self.placements:
            if p.shared:
                continue
            for gpu in p.gpus:
                other = seen.setdefault((p.node, gpu), p.rank)
                if other != p.rank:
                    raise ValueError(
                        f"GPU {gpu!r} on node {p.node!r} is granted to both rank {other} and rank {p.rank}"
                    )
        return self

    def subject(self) -> str:
        return self.job_id

    @property
    def workers(self) -> int:
        return len(self.placements)

    @property
    def gpu_share(self) -> float:
        """GPUs the gang holds, for accounting (GPU-seconds): the ranks' :attr:`Placement.gpu_share`."""
        return sum(p.gpu_share for p in self.placements)

    @property
    def whole_gpus(self) -> int:
        """Whole GPUs held by the gang (slices and shared slots not counted)."""
        return sum(len(p.gpus) for p in self.placements if not p.shared)


ReleaseReason = Literal["completed", "failed", "preempted", "node_failed", "cancelled", "resized"]
"""``resized``: an elastic job's allocation replaced by a grant at another size (``resizes`` names it)."""


class AllocationReleased(Event):
    """All GPUs of an allocation are free again."""

    TYPE = "allocation.released"
    VERSION = 1

    job_id: JobIdField
    allocation_id: AllocationIdField
    reason: ReleaseReason
    gpu_seconds: SecondsField | None = None
    """GPU-seconds the allocation held, for accounting."""

    def subject(self) -> str:
        return self.job_id


EVENTS: list[type[Event]] = [AllocationGranted, AllocationReleased]
