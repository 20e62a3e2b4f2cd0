"""Domain identifiers and quantities used in event payloads, each a distinct type with its wire constraints.

The NewTypes (``JobId``, ``NodeId`` ...) are what code passes around; the ``...Field`` aliases are the same
types with the constraints pydantic checks on the wire. Use the alias in models, the NewType elsewhere.
"""

from __future__ import annotations

from typing import Annotated, Literal, NewType

from pydantic import Field

SAFE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""A letter or digit, then letters, digits, '.', '_' or '-': safe in keys, paths, labels and env."""
CODE_PATTERN = r"^[a-z][a-z0-9_]*$"
"""Machine-readable codes are snake_case, e.g. "quota_exceeded"."""
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
LIMIT_EXCEEDED = "limit_exceeded"
"""The validation error type, and the decode code, of a value over a size limit (too long, too many)."""

JobId = NewType("JobId", str)
"""The id a producer gives a job; unique across the cluster's history and the Kafka key of its events."""
NodeId = NewType("NodeId", str)
"""A GPU node's name, as its agent registers it; the Kafka key of the nodes.* topics."""
GpuId = NewType("GpuId", str)
"""A GPU's id inside its node (e.g. "gpu0"); (NodeId, GpuId) names a GPU in the cluster."""
AllocationId = NewType("AllocationId", str)
"""One grant of GPUs to one attempt of a job; a requeued job gets a new allocation."""
QueueName = NewType("QueueName", str)
"""A team's queue, which holds its quota."""
MiB = NewType("MiB", int)
"""Memory in mebibytes."""
MilliGpu = NewType("MilliGpu", int)
"""A share of one GPU in thousandths: 1000 is a whole GPU, 250 a quarter (Alibaba's gpu_milli)."""
Seconds = NewType("Seconds", int)
"""A duration in whole seconds."""

JobIdField = Annotated[JobId, Field(min_length=1, max_length=128, pattern=SAFE_ID_PATTERN)]
NodeIdField = Annotated[NodeId, Field(min_length=1, max_length=253, pattern=SAFE_ID_PATTERN)]
GpuIdField = Annotated[GpuId, Field(min_length=1, max_length=64, pattern=SAFE_ID_PATTERN)]
AllocationIdField = Annotated[AllocationId, Field(min_length=1, max_length=160, pattern=SAFE_ID_PATTERN)]
QueueNameField = Annotated[QueueName, Field(min_length=1, max_length=63, pattern=SAFE_ID_PATTERN)]
MiBField = Annotated[MiB, Field(ge=1)]
MilliGpuField = Annotated[MilliGpu, Field(ge=1, le=1000)]
SecondsField = Annotated[Seconds, Field(ge=0)]
Code = Annotated[str, Field(min_length=1, max_length=64, pattern=CODE_PATTERN)]
Sentence = Annotated[str, Field(min_length=1, max_length=2000)]
"""Text for people: a reason, an explanation."""
Label = Annotated[str, Field(min_length=1, max_length=253, pattern=SAFE_ID_PATTERN)]
"""A topology label: an NVLink domain, a leaf switch, a spine block, a GPU model."""

TopologyLevel = Literal["nvlink", "node", "leaf", "spine"]
"""From tightest to loosest: one NVLink domain, one node, one leaf switch, one spine block."""
TopologyMode = Literal["required", "preferred"]
