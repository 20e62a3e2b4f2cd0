"""Settings of the transactional consume-process-produce loop (one frozen object per service)."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gangline.bus.security import KafkaSecurity


class ProcessorSettings(BaseModel):
    """Where to read, who we are, and how hard to try.

    ``instance_id`` must be stable across restarts of the same replica (a StatefulSet ordinal,
    a host name): it makes the ``transactional_id``, and with ``static_membership`` also the
    consumer's ``group.instance.id``, so a restarted replica fences its own previous
    incarnation (see :mod:`gangline.bus.processor`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str
    security: KafkaSecurity = Field(default_factory=KafkaSecurity.from_env)
    """Credentials and transport (unset: the ``GANGLINE_KAFKA_*`` environment, gangline.bus.security)."""
    service: str = Field(min_length=1)
    instance_id: str = Field(min_length=1)
    group_id: str = Field(min_length=1)
    input_topics: Annotated[tuple[str, ...], Field(min_length=1)]
    max_batch_records: int = Field(default=100, ge=1)
    poll_timeout_ms: int = Field(default=200, ge=1)
    linger_ms: int = Field(default=0, ge=0)
    """After a poll that returned fewer than ``max_batch_records``, wait this long and take what else
    arrived into the same transaction: fewer, larger transactions for a little latency (0: off)."""
    idle_commit_ms: int = Field(default=1_000, ge=0)
    """A batch that published nothing (heartbeats folded, records skipped) does not commit its
    offsets on its own: they ride with the next transaction that publishes, or are committed after
    this long. That saves the empty transactions a steady trickle of inputs would cost; after a crash
    at most this much more input is read again, which handlers already treat idempotently. 0: commit
    every batch."""
    offsets_in_every_transaction: bool = True
    """Commit the consumed offsets in every transaction that publishes (AddOffsetsToTxn and
    TxnOffsetCommit, two of its five round trips, and a marker on __consumer_offsets): a crash never
    re-reads an input whose outputs are in the log. False: publishing batches hold their offsets back
    too, like idle ones (``idle_commit_ms``), and a crash or a new leader re-reads at most that much
    input whose outputs are already committed. Only for handlers that then decide nothing again: their
    state folds their own outputs and is rebuilt from the log at start (the single-leader services).
    Within one run a committed batch is never handled again either way (``Processor._on_assigned``)."""
    max_handler_attempts: int = Field(default=3, ge=1)
    max_batch_attempts: int = Field(default=3, ge=1)
    """A batch that fails outside the handler (decoding, an output the broker refuses, the flush) in a way
    that blames its input is tried this many times; then its records one per transaction, and a record
    that fails alone this many times is dead-lettered and skipped. Lost connections and timeouts do not
    count (they are retried for as long as they last)."""
    retry_backoff_s: float = Field(default=0.1, ge=0)
    session_timeout_ms: int = Field(default=10_000, ge=1)
    heartbeat_interval_ms: int = Field(default=3_000, ge=1)
    transaction_timeout_ms: int = Field(default=60_000, ge=1)
    request_timeout_ms: int = Field(default=40_000, ge=1)
    producer_retry_backoff_ms: int = Field(default=100, ge=1)
    """The producer's wait before retrying a request. Right after a commit the next transaction's
    AddPartitionsToTxn / AddOffsetsToTxn are often refused (CONCURRENT_TRANSACTIONS) until the
    broker has written the previous markers, a few ms: a short backoff keeps that off the latency."""
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    static_membership: bool = False
    chained_topics: tuple[str, ...] = ()
    """Output topics whose records carry the hash chain (:mod:`gangline.bus.chain`): the
    allocations log, under the deployment's topic prefix."""

    transactional_role: str | None = None
    """Set for services where one replica at a time decides (a leader lock): the replicas share
    ``<group_id>.<transactional_role>``, so a new leader's producer fences a cut-off old one."""
    lock_session_timeout_ms: int = Field(default=1_500, ge=1)
    """How long the holder of a leader lock (services.common.leader) keeps it after it went silent: the
    most of a single-leader service's failover. The broker must allow it (group.min.session.timeout.ms)."""
    group_membership: bool = True
    """False: the processor joins no consumer group; it assigns itself every partition of its inputs and
    goes on from ``group_id``'s committed offsets (its transactions still commit there). For the one
    leader behind a lock (services.common.leader), which alone consumes: a new leader starts at once,
    without waiting for a dead leader's membership to expire, and a long batch makes no rebalance."""

    input_partitions: dict[str, tuple[int, ...]] = Field(default_factory=dict)
    """Per input topic, the partitions to read (a topic not named: all of them). Only without group
    membership: a pool's processor reads its pool's partitions of the pooled topics (gangline.bus.pools)."""

    @model_validator(mode="after")
    def _partitions_need_no_group(self) -> Self:
        if self.input_partitions and self.group_membership:
            raise ValueError(
                "input_partitions is for a processor without group membership (a lock owns them)"
            )
        return self

    @property
    def transactional_id(self) -> str:
        """``<group_id>.<instance_id>``: one transactional producer per service replica, or one per
        role (``transactional_role``) shared by the replicas that take turns leading."""
        return f"{self.group_id}.{self.transactional_role or self.instance_id}"
