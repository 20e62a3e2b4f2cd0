"""Re-run node_health's decisions from the log it read, and check each output equals the recorded one.

    gangline replay --from log.jsonl|kafka --verify --decider node-health [--prefix P]
    python -m services.node_health.replay --from log.jsonl|kafka [--prefix P]

The silence, check interval and error-rate limits are the service's settings, not in the log: the
replay reads them as the service does (``GANGLINE_SILENCE_S`` ...), or is given them
(:func:`replay_node_health`). The start of each run (silence is counted from it for nodes not heard
since) is in the ``gangline-started`` header of the run's first outputs.

node_health decides per event (:func:`~services.node_health.handlers.decide`), so it is replayed by
:class:`~services.common.replay.EventReplayer` from the batches its outputs record. It decides with
the wall clock (``now``) on heartbeats: each one is also a tick that may run a silence check (at most
every ``check_every_s``, and only while it is no further behind the heartbeats than ``max_lag``). A
check that found nothing leaves no trace, so neither its time nor whether it ran is in the log.

What is verified:

* every ``node.failed`` for silence (``heartbeat_timeout``): the heartbeat the log names as its cause
  is handled with ``now`` = the output's time, the check forced (a check did run then: it found
  something). The replay then declares exactly the nodes that had been silent longer than
  ``silence_s`` of the time the bus was heard (:mod:`gangline.core.silence`: every heartbeat handled
  before it, each at its record's timestamp, as the live fold had it; and the run's start), judged at
  the newest beat heard, and only if that heartbeat was within the lag limit; and the releases and
  requeues of every live allocation on them, with the same ids, attempts and checkpoints;
* every release for a ``node.failed`` reported by an agent or an operator, or a failed GPU, and every
  GPU drained (``degraded``) for repeated errors: these depend only on the events (their own times),
  so they are re-decided exactly, and one the log lacks is reported ("not in the log");
* the fold is keyed by node, GPU and allocation (one partition per node on the node topics), so the
  records between recorded transactions leave the same state however they were batched.

What is not verifiable: a node that went silent and was *not* declared failed. The replay runs a
silence check only where the log shows one found something; a heartbeat with no outputs is folded
without a check. So the replay neither misses a recorded declaration (a missing one is named) nor
invents one, but it cannot prove that a declaration was due and not made: whether a check ran then
depended on the live clock, the check interval and the lag, none of which the log records. Logs
written before ``gangline-started`` was recorded count silence from the run's first output instead; a
log file without records' timestamps hears each beat at its own time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gangline.bus import Outgoing
from gangline.events.base import Envelope
from gangline.events.nodes import NodeHeartbeat
from gangline.replay.log import LogRecord
from services.common.env import topic_names
from services.common.replay import (
    NO_TIME,
    EventReplayer,
    ReplayReport,
    ServiceModel,
    earliest,
    main,
    per_pool,
    verify_with,
)
from services.node_health.handlers import SOURCE, NodeHealthState, decide
from services.node_health.settings import NodeHealthSettings
from services.node_health.wiring import NODE_HEALTH_EVENTS, POOL_NODE_HEALTH_EVENTS, new_state, record_time

NAME = "node-health"
"""The decider's name for `gangline replay --decider`."""


class NodeHealthModel(ServiceModel[NodeHealthState]):
    name = "node_health"
    source = SOURCE

    def __init__(self, settings: NodeHealthSettings, *, pooled: bool = False) -> None:
        self.settings = settings
        self.topics = topic_names(settings)
        self._wanted = frozenset(POOL_NODE_HEALTH_EVENTS if pooled else NODE_HEALTH_EVENTS)
        self._heard_at: datetime | None = None
        """The timestamp of the record about to be handled (the replayer selects it just before)."""

    @property
    def output_topics(self) -> tuple[str, ...]:
        return (self.topics.health, self.topics.allocations, self.topics.events)

    @property
    def live_topics(self) -> tuple[str, ...]:
        t = self.topics
        return (t.inventory, t.health, t.operator, t.allocations, t.heartbeats, t.events)

    @property
    def restore_topics(self) -> tuple[str, ...]:
        t = self.topics
        return (t.inventory, t.health, t.operator, t.allocations, t.events)

    def new_state(self, started: datetime | None) -> NodeHealthState:
        return new_state(self.settings, now=started or NO_TIME)

    def restores(self, kind: str) -> bool:
        return kind in self._wanted or not kind

    def selects(self, state: NodeHealthState, record: LogRecord, kind: str) -> bool:
        self._heard_at = record_time(record.timestamp_ms)  # when the bus heard it, as the live fold had it
        return kind in self._wanted or not kind

    def restore(self, state: NodeHealthState, envelope: Envelope) -> None:
        state.restore(envelope)

    def handle(
        self, state: NodeHealthState, envelope: Envelope, caused: Sequence[Envelope]
    ) -> Sequence[Outgoing]:
        now = earliest(caused)
        heard_at, self._heard_at = self._heard_at, None
        if isinstance(envelope.data, NodeHeartbeat):
            if now is None:
                state.fold(
                    envelope, heard_at=heard_at
                )  # a check that found nothing, or none: the log cannot tell
                return []
            state.last_check = None  # a check ran then: it found what the log holds
        return decide(envelope, state, now=now or envelope.time, heard_at=heard_at)


def replay_node_health(records: Sequence[LogRecord], settings: NodeHealthSettings) -> ReplayReport:
    """Re-run node_health's handlers over the recorded inputs; every difference in its outputs, in order.
    With pools, each pool on its own (:func:`~services.common.replay.per_pool`)."""
    layout = settings.pool_layout
    if layout is None:
        return EventReplayer(NodeHealthModel(settings), records).replay()
    return per_pool(
        records,
        topic_names(settings),
        layout,
        lambda view: EventReplayer(NodeHealthModel(settings, pooled=True), view).replay(),
    )


def decider_topics(prefix: str) -> list[str]:
    """node_health's inputs under ``prefix`` (its outputs are on three of them)."""
    return list(NodeHealthModel(NodeHealthSettings(topic_prefix=prefix)).live_topics)


def replay_log(records: Sequence[LogRecord], *, prefix: str, gated: bool) -> ReplayReport:
    """With the settings the service reads (``GANGLINE_*``) under ``prefix``."""
    return replay_node_health(records, NodeHealthSettings.from_env(topic_prefix=prefix))


def verify_decisions(records: Sequence[LogRecord], *, prefix: str, gated: bool, max_problems: int) -> bool:
    """`gangline replay --verify --decider node-health`: replay, print the report; True if identical."""
    return verify_with(replay_log, records, prefix=prefix, gated=gated, max_problems=max_problems)


if __name__ == "__main__":
    raise SystemExit(
        main(prog="python -m services.node_health.replay", topics=decider_topics, replay_log=replay_log)
    )
