"""The node agent's settings: who this node is, where it sits, how often it speaks, where things go.

One frozen class. ``node``, ``leaf``, ``spine``, ``checkpoint_root`` and ``log_dir`` are required;
everything else has a production default. ``from_env`` reads ``GANGLINE_<FIELD>`` variables
(``GANGLINE_NODE``, ``GANGLINE_LEAF``, ``GANGLINE_HEARTBEAT_INTERVAL_S``, ``GANGLINE_TOPIC_PREFIX`` ...).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gangline.events import topics as catalogue
from gangline.events.types import SAFE_ID_PATTERN
from gangline.telemetry.metrics import METRICS_PORTS

ENV_PREFIX = "GANGLINE_"
SafeLabel = Annotated[str, Field(min_length=1, max_length=253, pattern=SAFE_ID_PATTERN)]


class AgentTopics(BaseModel):
    """The topics the agent reads and writes; tests point them at throw-away topics."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allocations: str = catalogue.ALLOCATIONS_LOG
    """Read: allocation.granted / allocation.released."""
    events: str = catalogue.JOBS_EVENTS
    """Read: job.admitted (the job's spec), job.preempting, job.resizing, job.requeued, peers' worker.exited.
    Written: job.started, worker.exited, job.checkpointed, job.completed, job.failed."""
    inventory: str = catalogue.NODES_INVENTORY
    heartbeats: str = catalogue.NODES_HEARTBEATS
    health: str = catalogue.NODES_HEALTH

    @classmethod
    def prefixed(cls, prefix: str) -> AgentTopics:
        """The catalogue names under ``prefix`` (as ``services.common.topics.TopicNames`` names them)."""
        return cls(
            allocations=prefix + catalogue.ALLOCATIONS_LOG,
            events=prefix + catalogue.JOBS_EVENTS,
            inventory=prefix + catalogue.NODES_INVENTORY,
            heartbeats=prefix + catalogue.NODES_HEARTBEATS,
            health=prefix + catalogue.NODES_HEALTH,
        )


class NodeAgentSettings(BaseModel):
    """Everything one node agent needs besides its collaborators (NVML, runner, producer)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: SafeLabel
    """This node's name: the Kafka key of its nodes.* events, the ``node`` of placements."""
    leaf: SafeLabel
    spine: SafeLabel
    nvlink_domain: SafeLabel | None = None
    """The NVLink domain label; None: the node itself (an 8-GPU box). An NVL72 rack names the rack."""
    address: Annotated[str, Field(min_length=1, max_length=253)] = "127.0.0.1"
    """How peers reach this node (MASTER_ADDR when rank 0 runs here); published in node.registered."""
    peer_address: str | None = None
    """When set, every other node is reached at this address (local runs: 127.0.0.1); otherwise a node's
    name is taken as its DNS name."""
    labels: dict[str, str] = Field(default_factory=dict)
    pools: str | None = None
    """GANGLINE_POOLS: the cluster's pools (``label=pool,...``, gangline.core.pools), as every service reads
    them: the agent sends its node's records and its jobs' reports to its pool's partition. None: by key."""

    checkpoint_root: Path
    """Jobs checkpoint under ``<checkpoint_root>/<job id>``: the same directory on every (re)start."""
    log_dir: Path
    """Rank logs: ``<log_dir>/<job>-a<attempt>-r<rank>.log``."""

    kafka_bootstrap: str = "127.0.0.1:9092"
    topics: AgentTopics = Field(default_factory=AgentTopics)
    group_id: str | None = None
    """The agent's consumer group; None: ``gangline.agent.<node>`` (each agent reads every grant)."""
    start_from: Literal["latest", "earliest"] = "latest"
    """Where a new consumer group starts reading; ``latest`` so a fresh node never replays old grants."""

    heartbeat_interval_s: Annotated[float, Field(gt=0)] = 5.0
    """Also the period of the health sample (``NvmlReader.sample``) fed to the health monitor."""
    xid_poll_ms: Annotated[int, Field(ge=0)] = 500
    """How long one ``nvmlEventSetWait`` blocks (in a worker thread)."""
    xid_idle_s: Annotated[float, Field(ge=0)] = 0.2
    """Pause between empty polls (the stand-in answers at once instead of blocking)."""
    poll_timeout_ms: Annotated[int, Field(ge=1)] = 200
    spec_wait_s: Annotated[float, Field(ge=0)] = 5.0
    """How long a grant waits for its job's spec (job.admitted) before it starts with the defaults."""

    master_port_base: Annotated[int, Field(ge=1024, le=65000)] = 29500
    master_port_span: Annotated[int, Field(ge=1, le=30000)] = 2000
    """MASTER_PORT is ``base + crc32(allocation id) % span``: every node of the gang computes the same."""
    default_command: tuple[str, ...] = ()
    """argv for jobs that give none (process runner only)."""
    preempt_signal: int = 15
    max_grace_s: Annotated[float, Field(ge=0)] = 600.0
    """Cap on the checkpoint grace taken from job.preempting's deadline."""
    stop_grace_s: Annotated[float, Field(ge=0)] = 10.0
    """Grace for ranks stopped by allocation.released or by the agent's own graceful stop."""
    report_repeated_errors: bool = True
    """Publish each job-fault or warning XID and correctable ECC error that leaves the GPU's state as it
    was, as ``gpu.error_reported`` (a report, not a change of state). The agent judges single events
    only; node_health applies the drain policy's rates (:mod:`gangline.core.health`) over these
    reports, so with this off no GPU of this node is drained for repeated errors."""
    metrics_host: str = "127.0.0.1"
    metrics_port: Annotated[int, Field(ge=0, le=65535)] | None = METRICS_PORTS["agent"]
    """``/metrics`` of this node's GPUs (GANGLINE_METRICS_PORT; None: not served)."""
    restart_policy: Literal["never", "on_failure"] = "on_failure"
    max_restarts: Annotated[int, Field(ge=0)] = 3
    restart_backoff_s: Annotated[float, Field(ge=0)] = 1.0

    @model_validator(mode="after")
    def _dirs_absolute(self) -> Self:
        for name in ("checkpoint_root", "log_dir"):
            if not getattr(self, name).is_absolute():
                raise ValueError(f"{name} must be an absolute path (got {getattr(self, name)})")
        return self

    @property
    def domain(self) -> str:
        return self.nvlink_domain or self.node

    @property
    def consumer_group(self) -> str:
        return self.group_id or f"gangline.agent.{self.node}"

    @property
    def source(self) -> str:
        """The CloudEvents ``source`` of everything this agent publishes."""
        return f"gangline/agent/{self.node}"

    def address_of(self, node: str) -> str:
        if node == self.node:
            return self.address
        return self.peer_address or node

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """``GANGLINE_<FIELD>`` variables (``GANGLINE_TOPIC_PREFIX`` for the topics), then ``overrides``."""
        source = os.environ if environ is None else environ
        values: dict[str, Any] = {
            k[len(ENV_PREFIX) :].lower(): v for k, v in source.items() if k.startswith(ENV_PREFIX) and v
        }
        prefix = values.pop("topic_prefix", None)
        if prefix is not None and "topics" not in overrides:
            values["topics"] = AgentTopics.prefixed(prefix)
        if "default_command" in values:
            values["default_command"] = tuple(values["default_command"].split())
        known = set(cls.model_fields)
        return cls.model_validate({k: v for k, v in {**values, **overrides}.items() if k in known})
