"""Re-run preemption's decisions from the log it read, and check each output equals the recorded one.

    gangline replay --from log.jsonl|kafka --verify --decider preemption [--prefix P] [--ungated]
    python -m services.preemption.replay --from log.jsonl|kafka [--prefix P] [--ungated]

The profile and ``gated`` are the service's settings, not in the log: the replay reads them as the
service does (``GANGLINE_PROFILE_PATH``; ``--ungated``), or is given them (:func:`replay_preemption`).

Preemption folds every event (:func:`~services.preemption.handlers.fold_event`) and decides once per
batch (:func:`~services.preemption.handlers.end_batch`): first it finishes the victims that
checkpointed in the batch or whose deadline passed (released, preempted, requeued), then it runs the
core's preempt and reclaim for the jobs placement said were pending in it and those quota holds
(``job.preempting``). Those outputs name the batch's last event as their cause. It is replayed by
:class:`~services.common.replay.EventReplayer` from the batches its outputs record. What that
guarantees here:

* every ``job.preempting`` (victims, deadline, reason with the GPU-hours they would lose) is
  re-decided by the same core cycle over the same mirror of the cluster, for the same waiting jobs,
  with ``now`` = the time on those outputs;
* every finish (``allocation.released`` ``preempted``, ``job.preempted``, ``job.requeued`` with its
  checkpoint and attempt) is re-decided at the end of the batch the log names, with ``now`` = its
  outputs' time: a checkpoint read in that batch (and no end of the victim's), or the deadline passed
  by then. A batch that left no outputs finished nothing, which the replay takes from the log;
* the mirror is the one lifecycle fold (order-independent, see :mod:`gangline.fold.cluster`); the
  rest of the state is keyed by allocation and job, so the records between recorded transactions
  leave the same state however they were batched. Those batches each searched and found nothing (they
  left no outputs): the replay takes that from the log rather than searching again, so a search that
  should have found victims and did not is not detected;
* the finishes and the search of one batch share one clock read, so one ``now`` replays both.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gangline.bus import Outgoing
from gangline.events.base import Envelope
from gangline.fold.cluster import FOLDED_EVENTS, POOL_FOLDED_EVENTS
from gangline.replay.log import LogRecord
from services.common.env import topic_names
from services.common.replay import (
    EventReplayer,
    ReplayReport,
    ServiceModel,
    latest,
    main,
    per_pool,
    verify_with,
)
from services.preemption.handlers import SOURCE, PreemptionState, end_batch, fold_event
from services.preemption.settings import PreemptionSettings
from services.preemption.wiring import new_state

NAME = "preemption"
"""The decider's name for `gangline replay --decider`."""

WANTED = frozenset({*FOLDED_EVENTS, "job.pending", "job.checkpointed"})
"""What the live ``select`` decodes (heartbeats too, while a victim is asked to checkpoint)."""
POOL_WANTED = frozenset({*POOL_FOLDED_EVENTS, "job.pending", "job.checkpointed"})
"""What a pool's preemption decodes: it learns a job from its ``job.routed`` (gangline.core.pools)."""


class PreemptionModel(ServiceModel[PreemptionState]):
    name = NAME
    source = SOURCE

    def __init__(self, settings: PreemptionSettings, *, pooled: bool = False) -> None:
        self.settings = settings
        self.topics = topic_names(settings)
        self._wanted = POOL_WANTED if pooled else WANTED

    @property
    def output_topics(self) -> tuple[str, ...]:
        return (self.topics.events, self.topics.allocations)

    @property
    def live_topics(self) -> tuple[str, ...]:
        return (*self.restore_topics, self.topics.heartbeats)

    @property
    def restore_topics(self) -> tuple[str, ...]:
        t = self.topics
        return (t.inventory, t.health, t.operator, t.events, t.allocations)

    def new_state(self, started: datetime | None) -> PreemptionState:
        return new_state(self.settings)

    def restores(self, kind: str) -> bool:
        return kind in self._wanted or not kind

    def selects(self, state: PreemptionState, record: LogRecord, kind: str) -> bool:
        if kind == "node.heartbeat":
            return state.awaits_deadline()
        return kind in self._wanted or not kind

    def restore(self, state: PreemptionState, envelope: Envelope) -> None:
        state.restore(envelope)

    def handle(
        self, state: PreemptionState, envelope: Envelope, caused: Sequence[Envelope]
    ) -> Sequence[Outgoing]:
        return fold_event(envelope, state, now=envelope.time)

    def end_batch(
        self, state: PreemptionState, last: Envelope, caused: Sequence[Envelope]
    ) -> Sequence[Outgoing]:
        return end_batch(state, now=latest(caused) or last.time)

    def after_quiet_batches(self, state: PreemptionState) -> None:
        state.pending.clear()  # each of those batches planned for its pending jobs and found nothing
        state.replan = False
        state.checkpointed.clear()  # nor finished a victim


def replay_preemption(records: Sequence[LogRecord], settings: PreemptionSettings) -> ReplayReport:
    """Re-run preemption's handlers over the recorded inputs; every difference in its outputs, in order.
    With pools, each pool on its own (:func:`~services.common.replay.per_pool`)."""
    layout = settings.pool_layout
    if layout is None:
        return EventReplayer(PreemptionModel(settings), records).replay()
    return per_pool(
        records,
        topic_names(settings),
        layout,
        lambda view: EventReplayer(PreemptionModel(settings, pooled=True), view).replay(),
    )


def decider_topics(prefix: str) -> list[str]:
    """Preemption's inputs under ``prefix`` (its outputs are on two of them)."""
    return list(PreemptionModel(PreemptionSettings(topic_prefix=prefix)).live_topics)


def replay_log(records: Sequence[LogRecord], *, prefix: str, gated: bool) -> ReplayReport:
    """With the settings the service reads (``GANGLINE_*``) under ``prefix``, and ``gated``."""
    return replay_preemption(records, PreemptionSettings.from_env(topic_prefix=prefix, gated=gated))


def verify_decisions(records: Sequence[LogRecord], *, prefix: str, gated: bool, max_problems: int) -> bool:
    """`gangline replay --verify --decider preemption`: replay, print the report; True if identical."""
    return verify_with(replay_log, records, prefix=prefix, gated=gated, max_problems=max_problems)


if __name__ == "__main__":
    raise SystemExit(
        main(prog="python -m services.preemption.replay", topics=decider_topics, replay_log=replay_log)
    )
