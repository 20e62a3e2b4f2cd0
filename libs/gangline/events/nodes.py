"""Node events on nodes.inventory, nodes.heartbeats and nodes.health. Subject: the node id."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, Field, model_validator

from gangline.events.base import MODEL_CONFIG, Event, JsonObject, Upcaster
from gangline.events.types import Code, GpuIdField, Label, MiBField, NodeIdField, Sentence

MIG_PROFILE_PATTERN = r"^[1-9][0-9]*g\.[1-9][0-9]*gb(\+[a-z]+)?$"


class MigInstance(BaseModel):
    """A MIG device already carved on a GPU: one compute instance of one GPU instance, as NVML lists it."""

    model_config = MODEL_CONFIG

    profile: Annotated[str, Field(pattern=MIG_PROFILE_PATTERN)]
    instance_id: Annotated[int, Field(ge=0)]
    """NVML's GPU-instance id (``nvmlDeviceGetGpuInstanceId``); not where the instance sits."""
    uuid: Annotated[str, Field(min_length=1, max_length=128)]
    """The MIG device UUID (``MIG-...``), what CUDA_VISIBLE_DEVICES takes."""
    memory_mib: MiBField
    compute_instance_id: Annotated[int, Field(ge=0)] | None = None
    """NVML's compute-instance id inside the GPU instance (``nvmlDeviceGetComputeInstanceId``)."""
    placement_start: Annotated[int, Field(ge=0, le=7)] | None = None
    """The first memory slice the GPU instance occupies (``nvmlGpuInstanceGetInfo`` placement.start).
    Placement hands out exactly the instances of a GPU that have it; on a GPU where none has it,
    any position the GPU's MIG geometry allows."""


class GpuInfo(BaseModel):
    """One GPU as NVML reports it."""

    model_config = MODEL_CONFIG

    id: GpuIdField
    index: Annotated[int, Field(ge=0)]
    """The NVML / CUDA device index, what CUDA_VISIBLE_DEVICES takes."""
    uuid: Annotated[str, Field(min_length=1, max_length=128)]
    model: Label
    memory_mib: MiBField
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()
    nvlink_peers: tuple[GpuIdField, ...] = ()
    """GPUs of this node it reaches over NVLink."""


class NodeRegistered(Event):
    """An agent announces its node: its GPUs and where it sits in the topology."""

    TYPE = "node.registered"
    VERSION = 1

    node: NodeIdField
    address: Annotated[str, Field(min_length=1, max_length=253)]
    """Host name or IP the node's ranks are reached at (MASTER_ADDR when rank 0 runs here)."""
    gpus: tuple[GpuInfo, ...]
    nvlink_domain: Label
    """The NVLink domain: the node itself for 8-GPU boxes, the rack for NVL72."""
    leaf: Label
    spine: Label
    labels: dict[
        Annotated[str, Field(min_length=1, max_length=63)], Annotated[str, Field(max_length=253)]
    ] = Field(default_factory=dict)
    agent_version: Annotated[str, Field(min_length=1, max_length=64)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        ids = [gpu.id for gpu in self.gpus]
        if len(set(ids)) != len(ids):
            raise ValueError(f"GPU ids must be unique on a node (got {ids})")
        indexes = [gpu.index for gpu in self.gpus]
        if len(set(indexes)) != len(indexes):
            raise ValueError(f"GPU indexes must be unique on a node (got {indexes})")
        known = set(ids)
        for gpu in self.gpus:
            strangers = sorted(set(gpu.nvlink_peers) - known - {gpu.id})
            if strangers or gpu.id in gpu.nvlink_peers:
                raise ValueError(
                    f"GPU {gpu.id!r} lists NVLink peers that are not other GPUs of this node: {strangers}"
                )
        return self

    def subject(self) -> str:
        return self.node


class NodeHeartbeatV1(Event):
    """node.heartbeat v1: GPU states as three flat lists of ids. Superseded by NodeHeartbeat (v2)."""

    TYPE = "node.heartbeat"
    VERSION = 1

    node: NodeIdField
    seq: Annotated[int, Field(ge=0)]
    gpus_healthy: tuple[GpuIdField, ...] = ()
    gpus_unhealthy: tuple[GpuIdField, ...] = ()
    gpus_busy: tuple[GpuIdField, ...] = ()

    def subject(self) -> str:
        return self.node


class GpuStatus(BaseModel):
    """One GPU's state at heartbeat time."""

    model_config = MODEL_CONFIG

    id: GpuIdField
    healthy: bool
    busy: bool
    utilization_pct: Annotated[int, Field(ge=0, le=100)] | None = None
    memory_used_mib: Annotated[int, Field(ge=0)] | None = None
    temperature_c: Annotated[int, Field(ge=-50, le=200)] | None = None


class NodeHeartbeat(Event):
    """The agent is alive; one status per GPU. ``seq`` increases by one per heartbeat of an agent run."""

    TYPE = "node.heartbeat"
    VERSION = 2

    node: NodeIdField
    seq: Annotated[int, Field(ge=0)]
    gpus: tuple[GpuStatus, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> Self:
        ids = [gpu.id for gpu in self.gpus]
        if len(set(ids)) != len(ids):
            raise ValueError(f"each GPU reports once per heartbeat (got {ids})")
        return self

    def subject(self) -> str:
        return self.node


def heartbeat_v1_to_v2(data: JsonObject) -> JsonObject:
    """Flat id lists become one status per GPU; the figures v1 never had stay unknown (null)."""
    healthy = set(data.get("gpus_healthy", ()))
    unhealthy = set(data.get("gpus_unhealthy", ()))
    busy = set(data.get("gpus_busy", ()))
    return {
        "node": data["node"],
        "seq": data["seq"],
        "gpus": [
            {
                "id": gpu,
                "healthy": gpu in healthy and gpu not in unhealthy,
                "busy": gpu in busy,
                "utilization_pct": None,
                "memory_used_mib": None,
                "temperature_c": None,
            }
            for gpu in sorted(healthy | unhealthy | busy)
        ],
    }


HealthState = Literal["healthy", "degraded", "failed"]


class HealthCause(BaseModel):
    """What NVML (or the agent) saw."""

    model_config = MODEL_CONFIG

    kind: Literal["xid", "ecc", "nvlink", "thermal", "lost", "operator", "recovered"]
    message: Sentence
    xid: Annotated[int, Field(ge=0)] | None = None


class GpuHealthChanged(Event):
    """A GPU's health changed; a failed GPU is cordoned and its gangs restarted elsewhere."""

    TYPE = "gpu.health_changed"
    VERSION = 1

    node: NodeIdField
    gpu: GpuIdField
    previous: HealthState
    state: HealthState
    cause: HealthCause

    def subject(self) -> str:
        return self.node


class GpuErrorReported(Event):
    """One error on a GPU that left its state as it was: a job-fault or watch XID, a correctable ECC
    error. node_health keeps rolling rates over them and drains a GPU whose errors repeat."""

    TYPE = "gpu.error_reported"
    VERSION = 1

    node: NodeIdField
    gpu: GpuIdField
    state: HealthState
    """The GPU's state when the error was seen (unchanged by it)."""
    cause: HealthCause
    count: Annotated[int, Field(ge=1)] = 1
    """How many errors of this cause: a jump of the correctable ECC counter between two samples is one
    report of that many."""

    def subject(self) -> str:
        return self.node


class NodeFailed(Event):
    """The node is gone (missed heartbeats, agent report or operator); its capacity is cordoned."""

    TYPE = "node.failed"
    VERSION = 1

    node: NodeIdField
    code: Literal["heartbeat_timeout", "agent_reported", "operator"]
    reason: Sentence
    last_seq: Annotated[int, Field(ge=0)] | None = None

    def subject(self) -> str:
        return self.node


class NodeRejected(Event):
    """A registration the scheduler cannot use: the node takes no work until it registers hardware it can.

    Placement writes it when it folds the ``node.registered`` (whose record it dead-letters); ``code``
    says what kind of problem, ``reason`` names it (the GPU, its model, the layout).
    """

    TYPE = "node.rejected"
    VERSION = 1

    node: NodeIdField
    code: Code
    """e.g. unsupported_hardware."""
    reason: Sentence
    registration_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    """The id of the ``node.registered`` event refused."""

    def subject(self) -> str:
        return self.node


CordonMode = Literal["cordon", "drain"]
MAX_DRAIN_GRACE_S = 7 * 86_400
DEFAULT_DRAIN_GRACE_S = 600
"""What a drain gives running work before it is asked to checkpoint and leave (10 minutes: long enough
for most jobs' periodic checkpoint to land, short enough for a maintenance window)."""
Operator = Annotated[str, Field(min_length=1, max_length=256)]


class NodeCordoned(Event):
    """An operator takes a node out of service (on nodes.operator, written by the API for an admin).

    ``cordon``: no new work lands on the node; what runs there runs on. ``drain``: no new work either,
    and once ``drain_grace_s`` has passed every job still on the node is asked to checkpoint (its own
    ``checkpoint_grace_s``, as for a preemption), then its GPUs are taken back and it is requeued to
    run elsewhere, so the node empties. A later cordon or drain of the node replaces this one; a
    ``node.uncordoned`` ends it. Re-registering does not: the operator said so, the node did not.
    """

    TYPE = "node.cordoned"
    VERSION = 1

    node: NodeIdField
    mode: CordonMode = "cordon"
    reason: Sentence | None = None
    requested_by: Operator | None = None
    drain_grace_s: Annotated[int, Field(ge=0, le=MAX_DRAIN_GRACE_S)] | None = None
    """Drain only (required there): seconds running work may still run before it is preempted."""

    @model_validator(mode="after")
    def _grace_with_drain(self) -> Self:
        if self.mode == "drain" and self.drain_grace_s is None:
            raise ValueError("a drain gives drain_grace_s (seconds running work may still run)")
        if self.mode == "cordon" and self.drain_grace_s is not None:
            raise ValueError("drain_grace_s is for a drain; a cordon leaves running work alone")
        return self

    def subject(self) -> str:
        return self.node


class NodeUncordoned(Event):
    """An operator puts a cordoned or draining node back into service: it takes new work again."""

    TYPE = "node.uncordoned"
    VERSION = 1

    node: NodeIdField
    reason: Sentence | None = None
    requested_by: Operator | None = None

    def subject(self) -> str:
        return self.node


EVENTS: list[type[Event]] = [
    NodeRegistered,
    NodeRejected,
    NodeHeartbeatV1,
    NodeHeartbeat,
    GpuHealthChanged,
    GpuErrorReported,
    NodeFailed,
    NodeCordoned,
    NodeUncordoned,
]
UPCASTERS: dict[tuple[str, int], Upcaster] = {(NodeHeartbeat.TYPE, 1): heartbeat_v1_to_v2}
