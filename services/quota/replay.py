"""Re-run quota's decisions from the log it read, and check each output equals the recorded one.

    gangline replay --from log.jsonl|kafka --verify --decider quota [--prefix P]
    python -m services.quota.replay --from log.jsonl|kafka [--prefix P]

The queues and their quotas are the service's settings, not in the log: the replay reads the same
queue configuration file as the service does (``GANGLINE_QUEUES_FILE``, and the fair-share half-life
``GANGLINE_FAIR_SHARE_HALF_LIFE_S``), or is given the settings (:func:`replay_quota`).

Quota decides per event (:func:`~services.quota.handlers.decide`), so it is replayed by
:class:`~services.common.replay.EventReplayer` from the batches its outputs record. What that
guarantees here:

* every ``job.queued``, ``job.pending`` and ``job.failed`` quota wrote, and every ``queue.status``
  (services/quota/status.py: throttled by event time, so as deterministic as the rest), is re-decided
  from the same events in the same order as the live run handled them (each record selected by the
  live ``select``, which skips what is keyed by a job retired by then: a held-back status goes with
  the next event quota handles, never with a skipped one), and compared field by field
  (the GPU model chosen, the usage figures, fair-share position and whether it is owed its nominal
  quota included); ``now`` only stamps the envelopes and is taken from them; the usage history is
  a function of event times;
* a restart is replayed as the service restarts: a fresh state restored from the log (quota's own
  pending reasons included, which say what it last told each waiting job, and its latest queue
  statuses). Older statuses that compaction removed from queues.status are missing from the log: a
  replay over a compacted topic reports them as decisions the log does not hold;
* what happened between two recorded transactions (batches that decided nothing) is folded in
  record-time order. The charges do not depend on that order (per job, queued attempts are counted
  against the attempts owed and the allocations released; the ledger is a sum; waiting jobs are let
  through by priority, fair share, the ``job.admitted`` time, then job id, all read from the log), and
  neither does the decayed usage (each charge is dated by the facts that began and ended it, in sums
  whose terms' order does not matter: ``gangline.core.fairshare.UsageIntegral``), so the fair-share
  figures are the live run's to the last bit. One exception, never seen in a run: a final release
  read before its job's admission (two topics) retires the job before it is known;
* a decision the live run took in a batch that the log does not show (all its outputs lost) cannot
  be told apart from no decision; one the replay takes there is reported ("not in the log").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from gangline.bus import Outgoing
from gangline.bus.records import KafkaRecord
from gangline.events.base import Envelope
from gangline.replay.log import LogRecord
from services.common.env import topic_names
from services.common.queues import load_queues
from services.common.replay import (
    EventReplayer,
    RecordView,
    ReplayReport,
    ServiceModel,
    earliest,
    main,
    verify_with,
)
from services.quota.handlers import SOURCE, QuotaState, decide
from services.quota.settings import QuotaSettings
from services.quota.wiring import (
    LIVE_EVENTS,
    RESTORE_EVENTS,
    input_topics,
    new_state,
    output_topics,
    quota_select,
    restore_topics,
)

NAME = "quota"
"""The decider's name for `gangline replay --decider`."""


class QuotaModel(ServiceModel[QuotaState]):
    name = NAME
    source = SOURCE

    def __init__(self, settings: QuotaSettings) -> None:
        self.settings = settings
        self.topics = topic_names(settings)
        self.queues = load_queues(settings.queues_file)
        self._select: tuple[QuotaState, Callable[[KafkaRecord], bool]] | None = None
        """The live ``select`` over the state being replayed (a new one per run)."""

    @property
    def output_topics(self) -> tuple[str, ...]:
        return output_topics(self.topics)

    @property
    def live_topics(self) -> tuple[str, ...]:
        return input_topics(self.topics)

    @property
    def restore_topics(self) -> tuple[str, ...]:
        return restore_topics(self.topics)

    def new_state(self, started: datetime | None) -> QuotaState:
        return new_state(self.settings, self.queues)

    def restores(self, kind: str) -> bool:
        return kind in RESTORE_EVENTS or not kind

    def selects(self, state: QuotaState, record: LogRecord, kind: str) -> bool:
        # The live select itself, on the record as the consumer reads it: what quota cannot read on the
        # node topics is placement's to dead-letter, and a record keyed by a job retired by then is
        # skipped. Quota never sees that record, so it is no event a held-back queue status goes with.
        if self._select is None or self._select[0] is not state:
            self._select = (state, quota_select(self.topics, state.retired, LIVE_EVENTS))
        return self._select[1](RecordView.of(record))

    def restore(self, state: QuotaState, envelope: Envelope) -> None:
        state.restore(envelope)

    def handle(self, state: QuotaState, envelope: Envelope, caused: Sequence[Envelope]) -> Sequence[Outgoing]:
        # Quietly at the event's own time: only the envelopes' time depends on ``now``.
        return decide(envelope, state, now=earliest(caused) or envelope.time)


def replay_quota(records: Sequence[LogRecord], settings: QuotaSettings) -> ReplayReport:
    """Re-run quota's handlers over the recorded inputs; every difference in its outputs, in order."""
    return EventReplayer(QuotaModel(settings), records).replay()


def decider_topics(prefix: str) -> list[str]:
    """Quota's inputs and outputs under ``prefix``."""
    model = QuotaModel(QuotaSettings(topic_prefix=prefix))
    return list(dict.fromkeys([*model.live_topics, *model.restore_topics, *model.output_topics]))


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
