"""Re-run admission's decisions from the log it read, and check each output equals the recorded one.

    gangline replay --from log.jsonl|kafka --verify --decider admission [--prefix P]
    python -m services.admission.replay --from log.jsonl|kafka [--prefix P]

The queues requests may name and their quotas are the service's configuration, not in the log: the
replay reads the same queues file as the service does (``GANGLINE_QUEUES_FILE``), or is given the
settings that name it (:func:`replay_admission`). Replaying under another file shows which
decisions that configuration would have changed.

Admission decides per request (:func:`~services.admission.handlers.on_request`), so it is replayed by
:class:`~services.common.replay.EventReplayer` from the batches its outputs record. What that
guarantees here:

* every ``job.admitted`` and ``job.rejected`` about a readable request is re-decided from the same
  requests, in the same order, against the same state (the nodes registered, the jobs admitted
  before: restored from ``jobs.events`` up to where the run's restore stopped, then its own
  decisions), and compared field by field; ``now`` only stamps the envelopes and is taken from them;
* the fold does not depend on the order of partitions (capacity is a function of the set of nodes,
  one partition per node; admitted ids are kept once per job), so the requests between recorded
  transactions (retries and cancellations that decided nothing) leave the same state however they
  were batched;
* a rejection of a request that could not be read (a dead letter; it names no cause) is decided again
  from the dead letter the replay makes of the same record (same code and reason; its id comes from
  the record's position), with ``now`` from the recorded rejection of that id. A record that is not
  JSON at all is not in an exported log (``KafkaSource`` skips it): its rejection is counted as
  unverified.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gangline.bus import DeadLetter, Outgoing
from gangline.events.base import Envelope
from gangline.replay.log import LogRecord
from services.admission.handlers import SOURCE, AdmissionState, on_request, rejection_of_dead_letter
from services.admission.settings import AdmissionSettings
from services.admission.wiring import new_state
from services.common.env import topic_names
from services.common.queues import load_queues
from services.common.replay import (
    NO_TIME,
    EventReplayer,
    ReplayReport,
    ServiceModel,
    earliest,
    main,
    verify_with,
)

NAME = "admission"
"""The decider's name for `gangline replay --decider`."""


class AdmissionModel(ServiceModel[AdmissionState]):
    name = NAME
    source = SOURCE

    def __init__(self, settings: AdmissionSettings) -> None:
        self.settings = settings
        self.topics = topic_names(settings)
        self.queues = load_queues(settings.queues_file)

    @property
    def output_topics(self) -> tuple[str, ...]:
        return (self.topics.events,)

    @property
    def live_topics(self) -> tuple[str, ...]:
        return (self.topics.requests, self.topics.inventory)

    @property
    def restore_topics(self) -> tuple[str, ...]:
        return (self.topics.inventory, self.topics.events)

    def new_state(self, started: datetime | None) -> AdmissionState:
        return new_state(self.settings, self.queues)

    def restore(self, state: AdmissionState, envelope: Envelope) -> None:
        state.restore(envelope)

    def unreadable(
        self, state: AdmissionState, letter: DeadLetter, uncaused: Sequence[Envelope]
    ) -> Sequence[Outgoing]:
        outputs = rejection_of_dead_letter(letter, state, now=NO_TIME)
        recorded = {e.id: e.time for e in uncaused}
        return [
            (topic, envelope.model_copy(update={"time": recorded.get(envelope.id, NO_TIME)}))
            for topic, envelope in outputs
        ]

    def handle(
        self, state: AdmissionState, envelope: Envelope, caused: Sequence[Envelope]
    ) -> Sequence[Outgoing]:
        # Quietly at the request's own time: only the envelopes' time depends on ``now``.
        return on_request(envelope, state, now=earliest(caused) or envelope.time)


def replay_admission(records: Sequence[LogRecord], settings: AdmissionSettings) -> ReplayReport:
    """Re-run admission's handlers over the recorded inputs; every difference in its outputs, in order."""
    return EventReplayer(AdmissionModel(settings), records).replay()


def decider_topics(prefix: str) -> list[str]:
    """Admission's inputs and restore topics under ``prefix`` (its outputs are on jobs.events)."""
    model = AdmissionModel(AdmissionSettings(topic_prefix=prefix))
    return list(dict.fromkeys([*model.live_topics, *model.restore_topics]))


def replay_log(records: Sequence[LogRecord], *, prefix: str, gated: bool) -> ReplayReport:
    """With the settings the service reads (``GANGLINE_*``) under ``prefix``."""
    return replay_admission(records, AdmissionSettings.from_env(topic_prefix=prefix))


def verify_decisions(records: Sequence[LogRecord], *, prefix: str, gated: bool, max_problems: int) -> bool:
    """`gangline replay --verify --decider admission`: replay, print the report; True if identical."""
    return verify_with(replay_log, records, prefix=prefix, gated=gated, max_problems=max_problems)


if __name__ == "__main__":
    raise SystemExit(
        main(prog="python -m services.admission.replay", topics=decider_topics, replay_log=replay_log)
    )
