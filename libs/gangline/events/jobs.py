"""Job events: requests on jobs.requests, the job's lifecycle on jobs.events. Subject: the job id."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from gangline.events.allocations import Placement
from gangline.events.base import MODEL_CONFIG, Event, UtcDatetime
from gangline.events.types import (
    ENV_NAME_PATTERN,
    LIMIT_EXCEEDED,
    AllocationIdField,
    Code,
    GpuIdField,
    JobIdField,
    Label,
    MiB,
    MilliGpuField,
    NodeIdField,
    QueueNameField,
    Seconds,
    SecondsField,
    Sentence,
    TopologyLevel,
    TopologyMode,
)

MAX_PRIORITY = 1_000_000
MAX_WORKERS = 100_000
MAX_COMMAND_ITEMS = 1024
"""argv entries of a job's command."""
MAX_COMMAND_ITEM_CHARS = 4096
MAX_ENV_ENTRIES = 256
MAX_ENV_VALUE_CHARS = 32_768
MAX_COMMAND_AND_ENV_BYTES = 256 * 1024
"""The command and env of one job together, as UTF-8 JSON: keeps a ``job.admitted`` (which carries them)
far below the broker's 1 MiB record limit, like Linux's ``ARG_MAX`` keeps argv and environ bounded."""
MAX_DURATION_HINT_S = 366 * 86_400
MAX_TIME_LIMIT_S = 30 * 86_400
"""30 days: longer than any training run between checkpoints should go unattended; a job that needs
more asks again (resuming from its checkpoint)."""
MAX_GPU_MEMORY_MIB = 16 * 1024 * 1024
"""16 TiB per GPU: far above any GPU, low enough that the number is a number."""
NO_NUL = r"^[^\x00]*$"
"""Strings handed to processes and stored in PostgreSQL carry no NUL character."""
EnvName = Annotated[str, Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN)]
JobState = Literal[
    "requested",
    "admitted",
    "rejected",
    "queued",
    "pending",
    "placed",
    "running",
    "preempting",
    "resizing",
    "preempted",
    "requeued",
    "completed",
    "failed",
    "cancelled",
]
"""Where a job stands in its lifecycle, as the ledger's ``jobs`` projection keeps it (the latest of the
events below, named as a state), the API filters on (``GET /v1/jobs?state=``) and the CLI offers."""
JOB_STATES: tuple[JobState, ...] = get_args(JobState)
"""Every :data:`JobState`, in lifecycle order."""


def command_and_env_bytes(command: Sequence[str], env: Mapping[str, str]) -> int:
    """What :data:`MAX_COMMAND_AND_ENV_BYTES` bounds: the command and env together, as UTF-8 JSON."""
    return len(json.dumps([list(command), dict(env)], ensure_ascii=False, separators=(",", ":")).encode())


def _given(field: str, kind: str) -> dict[str, Any]:
    return {"required": [field], "properties": {field: {"type": kind}}}


SLICE_RULE: dict[str, Any] = {
    "allOf": [
        {
            "if": _given("mig_profile", "string"),
            "then": {
                "required": ["gpus_per_worker"],
                "properties": {"gpus_per_worker": {"const": 0}, "gpu_fraction_milli": {"type": "null"}},
            },
            "else": {
                "if": _given("gpu_fraction_milli", "integer"),
                "then": {"required": ["gpus_per_worker"], "properties": {"gpus_per_worker": {"const": 0}}},
                "else": {"properties": {"gpus_per_worker": {"minimum": 1}}},
            },
        }
    ]
}
"""JobSpec's rule on slices (``_consistent``), in its JSON Schema: a MIG profile or a GPU fraction takes
``gpus_per_worker: 0`` (one slice per worker, not both); whole GPUs take ``gpus_per_worker >= 1``."""


class Topology(BaseModel):
    """Keep all ranks inside one ``level`` of the topology, as a hard constraint or a preference."""

    model_config = MODEL_CONFIG

    level: TopologyLevel
    mode: TopologyMode = "required"


class JobSpec(BaseModel):
    """What a job asks for: W workers x G GPUs each, and how it may be placed and preempted.

    GPUs are whole unless the job asks for a slice: with ``mig_profile`` or ``gpu_fraction_milli`` each
    worker gets one MIG slice / one shared slot of a GPU, and ``gpus_per_worker`` must be 0.
    Elastic jobs give ``min_workers``/``max_workers`` around ``workers`` (the size it asks for now).

    Every string, list and map is bounded, so no request makes an event over the broker's 1 MiB limit:
    ids and labels as their types say (job id 128 characters, queue 63, GPU type 253), ``command`` at
    most 1,024 items of 4,096 characters, ``env`` at most 256 entries (names 256 characters, values
    32,768), and ``command`` and ``env`` together at most 256 KiB of UTF-8 JSON (``limit_exceeded``);
    strings handed to the workers hold no NUL.
    """

    model_config = ConfigDict(**MODEL_CONFIG, json_schema_extra=SLICE_RULE)

    queue: QueueNameField
    workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)]
    gpus_per_worker: Annotated[int, Field(ge=0, le=1024)]
    priority: Annotated[int, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] = 0
    """Higher wins; urgent work may preempt lower-priority or over-quota work."""
    gpu_type: Label | None = None
    """A GPU model name as nodes register it (e.g. "H100-SXM5-80GB"); None takes any."""
    gpu_memory_mib: Annotated[MiB, Field(ge=1, le=MAX_GPU_MEMORY_MIB)] | None = None
    """Least memory per GPU (or per slice / shared slot)."""
    mig_profile: (
        Annotated[str, Field(max_length=32, pattern=r"^[1-9][0-9]*g\.[1-9][0-9]*gb(\+[a-z]+)?$")] | None
    ) = None
    """A MIG profile such as "1g.10gb" or "3g.40gb"."""
    gpu_fraction_milli: MilliGpuField | None = None
    """A shared slot of one GPU, in thousandths (250 = a quarter)."""
    topology: Topology | None = None
    preemptible: bool = False
    checkpoint_grace_s: Annotated[int, Field(ge=0, le=86_400)] = 30
    """How long the job has to checkpoint once asked, before its GPUs are taken."""
    command: Annotated[
        tuple[Annotated[str, Field(max_length=MAX_COMMAND_ITEM_CHARS, pattern=NO_NUL)], ...],
        Field(max_length=MAX_COMMAND_ITEMS),
    ] = ()
    """argv of each worker; empty when the agent's default entry point is used."""
    env: Annotated[
        dict[EnvName, Annotated[str, Field(max_length=MAX_ENV_VALUE_CHARS, pattern=NO_NUL)]],
        # Names that do not match the pattern are refused: say so in the schema (patternProperties alone
        # would let them through).
        Field(max_length=MAX_ENV_ENTRIES, json_schema_extra={"additionalProperties": False}),
    ] = Field(default_factory=dict)
    duration_hint_s: Annotated[int, Field(ge=1, le=MAX_DURATION_HINT_S)] | None = None
    """The producer's estimate of run time, used by backfill; never enforced (at most 366 days)."""
    time_limit_s: Annotated[int, Field(ge=1, le=MAX_TIME_LIMIT_S)] | None = None
    """Wall-clock limit of one run (attempt): at the limit the agent sends the checkpoint signal, gives
    the job its ``checkpoint_grace_s``, stops it, and the job ends ``job.failed`` code ``time_limit``.
    Backfill plans with the smaller of the limit and ``duration_hint_s`` (at most 30 days)."""
    min_workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)] | None = None
    max_workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)] | None = None
    submitted_by: Annotated[str, Field(min_length=1, max_length=256)] | None = None

    @model_validator(mode="after")
    def _bounded(self) -> Self:
        if not self.command and not self.env:
            return self
        size = command_and_env_bytes(self.command, self.env)
        if size > MAX_COMMAND_AND_ENV_BYTES:
            raise PydanticCustomError(
                LIMIT_EXCEEDED,
                "command and env together must be at most {limit} bytes of UTF-8 JSON (got {size})",
                {"limit": MAX_COMMAND_AND_ENV_BYTES, "size": size},
            )
        return self

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        sliced = self.mig_profile is not None or self.gpu_fraction_milli is not None
        if self.mig_profile is not None and self.gpu_fraction_milli is not None:
            raise ValueError("give mig_profile or gpu_fraction_milli, not both")
        if sliced and self.gpus_per_worker != 0:
            raise ValueError(
                f"gpus_per_worker must be 0 when a MIG profile or GPU fraction is asked for "
                f"(got {self.gpus_per_worker}); each worker gets one slice"
            )
        if not sliced and self.gpus_per_worker == 0:
            raise ValueError(
                "gpus_per_worker must be >= 1 unless mig_profile or gpu_fraction_milli is given (got 0)"
            )
        if self.min_workers is not None and self.min_workers > self.workers:
            raise ValueError(f"min_workers ({self.min_workers}) must be <= workers ({self.workers})")
        if self.max_workers is not None and self.max_workers < self.workers:
            raise ValueError(f"max_workers ({self.max_workers}) must be >= workers ({self.workers})")
        return self

    @property
    def total_gpus(self) -> int:
        """Whole GPUs the gang holds when placed at ``workers`` (0 for sliced jobs)."""
        return self.workers * self.gpus_per_worker

    @property
    def elastic(self) -> bool:
        return self.min_workers is not None or self.max_workers is not None


class JobRequested(JobSpec, Event):
    """A producer asks for a job to run. Validated again by admission, which answers admitted or rejected."""

    TYPE = "job.requested"
    VERSION = 1

    job_id: JobIdField

    def subject(self) -> str:
        return self.job_id

    def spec(self) -> JobSpec:
        """The request without its id, as admission passes it on."""
        return JobSpec.model_validate(self.model_dump(exclude={"job_id"}))


class JobCancelRequested(Event):
    """A producer asks to stop a job, queued or running."""

    TYPE = "job.cancel_requested"
    VERSION = 1

    job_id: JobIdField
    reason: Sentence | None = None
    requested_by: Annotated[str, Field(min_length=1, max_length=256)] | None = None

    def subject(self) -> str:
        return self.job_id


class _JobEvent(Event):
    job_id: JobIdField

    def subject(self) -> str:
        return self.job_id


class JobAdmitted(_JobEvent):
    """Admission accepted the request; carries the spec so later services need only jobs.events."""

    TYPE = "job.admitted"
    VERSION = 1

    spec: JobSpec


class JobRouted(_JobEvent):
    """Quota routed an admitted job to one pool of the cluster (gangline.core.pools), which can hold it whole.

    Written only when the cluster is split into pools, on the pool's partition of jobs.events, as the first
    record of the job there: the pool's placement, preemption and node_health, which read only their
    pool's partitions (not the ``job.admitted``, which may be on another), learn the job from it. Every
    later record of the job is on the same partition; the job keeps its pool for all its attempts."""

    TYPE = "job.routed"
    VERSION = 1

    pool: Label
    spec: JobSpec
    admitted_at: UtcDatetime
    """When the job was admitted (its place in line, as job.admitted's time gives it)."""


class JobRejected(Event):
    """A request that will never run: invalid, unreadable, or refused by policy. The producer reads this.

    ``job_id`` is None when the message was too broken to read it.
    """

    TYPE = "job.rejected"
    VERSION = 1

    job_id: JobIdField | None = None
    code: Code
    """e.g. malformed_message, unknown_event_type, schema_violation, unknown_queue, duplicate_job."""
    reason: Sentence

    def subject(self) -> str:
        return self.job_id if self.job_id is not None else UNKNOWN_JOB


UNKNOWN_JOB = "unknown"
"""The subject (and Kafka key) of a rejection whose job id could not be read."""


class JobQueued(_JobEvent):
    """The job waits in its queue for a scheduling cycle."""

    TYPE = "job.queued"
    VERSION = 1

    queue: QueueNameField
    gpu_type: Label | None = None
    """The GPU model quota charged this attempt to, when the job named none (its flavour, as Kueue
    says): placement puts it only on GPUs of that model. None: any model the job's spec allows."""
    replaces: str | None = Field(default=None, max_length=128)
    """The id of the ``job.queued`` of this attempt whose charge this one moves to ``gpu_type`` (quota
    moves a job not placed yet when the nodes of the model it was charged to cannot hold it any more):
    not a new attempt. None: a new attempt."""
    pool: Label | None = None
    """The pool the job was routed to (``job.routed``), when the cluster is split into pools: the event is
    on that pool's partition. None: no pools."""


class PendingReason(BaseModel):
    """One constraint that keeps a job from being placed, and what would unblock it.

    ``code`` is one of: quota, gang_size, topology, fragmentation, health, priority, gpu_type, memory,
    reservation (others may be added); ``constraint`` names the rule or plugin that said no.
    """

    model_config = MODEL_CONFIG

    code: Code
    constraint: Annotated[str, Field(min_length=1, max_length=128)]
    message: Sentence
    details: dict[Annotated[str, Field(min_length=1, max_length=64)], int | str | bool] = Field(
        default_factory=dict
    )
    """Figures behind the message, e.g. {"needed_gpus": 8, "largest_free_domain": 6}."""
    unblock: Sentence | None = None
    """What would let the job run, e.g. "wait for 2 GPUs in one NVLink domain or relax topology"."""


class JobPending(_JobEvent):
    """The job could not be placed in this scheduling cycle, and why (at least one reason)."""

    TYPE = "job.pending"
    VERSION = 1

    cycle: Annotated[int, Field(ge=0)] | None = None
    reasons: Annotated[tuple[PendingReason, ...], Field(min_length=1)]


class DecisionReason(BaseModel):
    """One plugin's word on a placement decision."""

    model_config = MODEL_CONFIG

    plugin: Annotated[str, Field(min_length=1, max_length=128)]
    message: Sentence
    score: int | None = None


class JobPlaced(_JobEvent):
    """The scheduler chose where every rank goes; the grant itself is allocation.granted."""

    TYPE = "job.placed"
    VERSION = 1

    allocation_id: AllocationIdField
    nodes: Annotated[tuple[NodeIdField, ...], Field(min_length=1)]
    cycle: Annotated[int, Field(ge=0)] | None = None
    score: int | None = None
    reasons: tuple[DecisionReason, ...] = ()


class JobStarted(_JobEvent):
    """Every rank of the gang is running."""

    TYPE = "job.started"
    VERSION = 1

    allocation_id: AllocationIdField
    attempt: Annotated[int, Field(ge=1)] = 1


class JobPreempting(_JobEvent):
    """The job must give its GPUs back: it is asked to checkpoint and has until ``deadline``."""

    TYPE = "job.preempting"
    VERSION = 1

    allocation_id: AllocationIdField
    deadline: UtcDatetime
    reason: Sentence
    preemptor_job_id: JobIdField | None = None


class JobResizing(_JobEvent):
    """An elastic job is asked to checkpoint so it can restart at another size (shrink or grow).

    The same request as ``job.preempting`` (the agents checkpoint and stop the ranks; ``job.checkpointed``
    acknowledges it), but the job is not requeued: once it checkpointed (or at ``deadline``) preemption
    releases ``allocation_id`` (reason ``resized``) and grants ``placements`` in one transaction, a new
    allocation with ``to_workers`` ranks that names the old one (``allocation.granted.resizes``).
    A shrink keeps the first ``to_workers`` placements; a grow's extra GPUs are held for the job (no
    other job is granted them) from this event until the resize is done.
    """

    TYPE = "job.resizing"
    VERSION = 1

    allocation_id: AllocationIdField
    from_workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)]
    to_workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)]
    placements: Annotated[tuple[Placement, ...], Field(min_length=1, max_length=MAX_WORKERS)]
    """Where the ranks run after the resize, ranks 0..to_workers-1."""
    deadline: UtcDatetime
    reason: Sentence
    preemptor_job_id: JobIdField | None = None
    """For a shrink: the waiting job the freed GPUs are for."""

    @model_validator(mode="after")
    def _sized(self) -> Self:
        if len(self.placements) != self.to_workers or self.from_workers == self.to_workers:
            raise ValueError(
                f"a resize from {self.from_workers} to {self.to_workers} workers needs "
                f"{self.to_workers} placements and another size (got {len(self.placements)})"
            )
        return self

    @property
    def grows(self) -> bool:
        return self.to_workers > self.from_workers


class JobCheckpointed(_JobEvent):
    """The agent confirms the job wrote a checkpoint (after job.preempting, or on its own schedule)."""

    TYPE = "job.checkpointed"
    VERSION = 1

    allocation_id: AllocationIdField
    node: NodeIdField
    checkpoint: Annotated[str, Field(min_length=1, max_length=4096)]
    """Where the checkpoint is (a path or URI the job resumes from)."""
    step: Annotated[int, Field(ge=0)] | None = None


class JobPreempted(_JobEvent):
    """The job's GPUs were taken back; ``checkpointed`` says whether it checkpointed before the deadline."""

    TYPE = "job.preempted"
    VERSION = 1

    allocation_id: AllocationIdField
    checkpointed: bool
    lost_gpu_seconds: SecondsField = Seconds(0)
    """GPU-seconds of work done since the last checkpoint, thrown away."""


class JobRequeued(_JobEvent):
    """The job goes back to its queue to run again, from ``resume_from`` when a checkpoint exists."""

    TYPE = "job.requeued"
    VERSION = 1

    reason: Literal["preempted", "node_failed", "gpu_failed", "worker_failed", "resized"]
    attempt: Annotated[int, Field(ge=2)]
    """The attempt number the job will run as next."""
    resume_from: Annotated[str, Field(min_length=1, max_length=4096)] | None = None


class JobCompleted(_JobEvent):
    """Every rank exited 0."""

    TYPE = "job.completed"
    VERSION = 1

    allocation_id: AllocationIdField
    gpu_seconds: SecondsField | None = None


class JobFailed(_JobEvent):
    """The job ended without success and will not be retried."""

    TYPE = "job.failed"
    VERSION = 1

    allocation_id: AllocationIdField | None = None
    code: Code
    """e.g. worker_exit, restarts_exhausted, cancelled_while_running, node_failed."""
    reason: Sentence
    exit_code: int | None = None
    gpu_seconds: SecondsField | None = None
    """GPU-seconds the allocation held until it ended, when an agent ran it (for accounting)."""


class WorkerExited(_JobEvent):
    """One rank's process ended, as its agent saw it; the job's fate is decided from these."""

    TYPE = "worker.exited"
    VERSION = 1

    allocation_id: AllocationIdField
    rank: Annotated[int, Field(ge=0)]
    node: NodeIdField
    exit_code: int | None = None
    signal: Annotated[int, Field(ge=1, le=64)] | None = None
    restarts: Annotated[int, Field(ge=0)] = 0
    gpus: tuple[GpuIdField, ...] = ()


EVENTS: list[type[Event]] = [
    JobRequested,
    JobCancelRequested,
    JobAdmitted,
    JobRejected,
    JobRouted,
    JobQueued,
    JobPending,
    JobPlaced,
    JobStarted,
    JobPreempting,
    JobResizing,
    JobCheckpointed,
    JobPreempted,
    JobRequeued,
    JobCompleted,
    JobFailed,
    WorkerExited,
]
