"""Re-run quota's decisions from the log it read, and check each output equals the recorded one.

    gangline replay --from log.jsonl|kafka --verify --decider quota [--prefix P]
    python -m services.quota.replay --from log.jsonl|kafka [--prefix P]

The queue limits are the service's settings, not in the log: the replay reads them as the service
does (``GANGLINE_QUEUE_LIMITS``), or is given them (:func:`replay_quota`).

Quota decides per event (:func:`~services.quota.handlers.decide`), so it is replayed by
:class:`~services.common.replay.EventReplayer` from the batches its outputs record. What that
guarantees here:

* every ``job.queued``, ``job.pending`` and ``job.failed`` quota wrote is re-decided from the same
  events in the same order as the live run handled them, and compared field by field (the usage and
  limit in a pending reason included); ``now`` only stamps the envelopes and is taken from them;
* what happened between two recorded transactions (batches that decided nothing) is folded in
  record-time order: quota's fold does not depend on that order (per job it counts queued events
  against the attempts owed; usage is a sum; waiting jobs are let through by priority, the
  ``job.admitted`` time, then job id, all read from the log), so the state at each recorded batch is
  the live one. One exception, never seen in a run: a final release read before its job's admission
  (two topics) retires the job before it is known;
* a decision the live run took in a batch that the log does not show (all its outputs lost) cannot
  be told apart from no decision; one the replay takes there is reported ("not in the log").
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gangline.bus import Outgoing
from gangline.events.base import Envelope
from gangline.replay.log import LogRecord
from services.common.env import topic_names
from services.common.replay import EventReplayer, ReplayReport, ServiceModel, earliest, main, verify_with
from services.quota.handlers import SOURCE, QuotaState, decide
from services.quota.settings import QuotaSettings
from services.quota.wiring import QUOTA_EVENTS, new_state

NAME = "quota"
"""The decider's name for `gangline replay --decider`."""


class QuotaModel(ServiceModel[QuotaState]):
    name = NAME
    source = SOURCE

    def __init__(self, settings: QuotaSettings) -> None:
        self.settings = settings
        self.topics = topic_names(settings)

    @property
    def output_topics(self) -> tuple[str, ...]:
        return (self.topics.events,)

    @property
    def live_topics(self) -> tuple[str, ...]:
        return (self.topics.events, self.topics.allocations)

    @property
    def restore_topics(self) -> tuple[str, ...]:
        return (self.topics.events, self.topics.allocations)

    def new_state(self, started: datetime | None) -> QuotaState:
        return new_state(self.settings)

    def restores(self, kind: str) -> bool:
        return kind in QUOTA_EVENTS or not kind

    def selects(self, state: QuotaState, record: LogRecord, kind: str) -> bool:
        return kind in QUOTA_EVENTS or not kind

    def restore(self, state: QuotaState, envelope: Envelope) -> None:
        state.restore(envelope)

    def handle(self, state: QuotaState, envelope: Envelope, caused: Sequence[Envelope]) -> Sequence[Outgoing]:
        # Quietly at the event's own time: only the envelopes' time depends on ``now``.
        return decide(envelope, state, now=earliest(caused) or envelope.time)


def replay_quota(records: Sequence[LogRecord], settings: QuotaSettings) -> ReplayReport:
    """Re-run quota's handlers over the recorded inputs; every difference in its outputs, in order."""
    return EventReplayer(QuotaModel(settings), records).replay()


def decider_topics(prefix: str) -> list[str]:
    """Quota's inputs under ``prefix`` (its outputs are on one of them)."""
    model = QuotaModel(QuotaSettings(topic_prefix=prefix))
    return list(dict.fromkeys([*model.live_topics, *model.restore_topics]))


def replay_log(records: Sequence[LogRecord], *, prefix: str, gated: bool) -> ReplayReport:
    """With the settings the service reads (``GANGLINE_*``) under ``prefix``."""
    return replay_quota(records, QuotaSettings.from_env(topic_prefix=prefix))


def verify_decisions(records: Sequence[LogRecord], *, prefix: str, gated: bool, max_problems: int) -> bool:
    """`gangline replay --verify --decider quota`: replay, print the report; True if identical."""
    return verify_with(replay_log, records, prefix=prefix, gated=gated, max_problems=max_problems)


if __name__ == "__main__":
    raise SystemExit(
        main(prog="python -m services.quota.replay", topics=decider_topics, replay_log=replay_log)
    )
