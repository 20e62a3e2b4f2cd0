"""Re-run placement's own decisions from the log it read, and check each output equals the recorded one.

    gangline replay --from log.jsonl --verify --decider placement-service [--prefix P] [--ungated]
    python -m services.placement.replay --from kafka [--bootstrap B] [--prefix P] [--ungated]

Placement folds the events it reads (:func:`~services.placement.handlers.fold_event`) and runs one
scheduling cycle per batch (:func:`~services.placement.handlers.end_batch`). Every output of a
batch carries, in Kafka headers (:mod:`gangline.bus.positions`), the input positions the state
had folded when it decided (``gangline-inputs``) and the id of the process run
(``gangline-incarnation``). So each recorded transaction is replayed as:

1. group placement's outputs by those two headers; order the groups by their positions;
2. on a new incarnation, start from a fresh state and restore it from the restore topics
   (``nodes.inventory``, ``nodes.health``, ``jobs.events``, ``allocations.log``) below the positions,
   as the service's start does; within one, fold the records between the previous positions and
   these exactly as the live service selects and folds them (its own grants skipped, heartbeats
   only while a cycle is owed, cancellations from ``jobs.requests`` decide on their own);
3. run the batch's end (the releases of jobs that ended, then its cycle) with the recorded cause and
   ``now`` (the time on those outputs: ``now`` only stamps envelopes), and compare every output with
   the recorded one: event id, type, subject, time, cause and every field of the payload (job,
   allocation, ranks, nodes, GPUs, score, reasons).

The cycle number counts cycles, and cycles that changed nothing leave no trace in the log: each
batch's first cycle number is taken from its recorded outputs (decisions do not depend on it).
Batches that decided nothing are folded into the next batch that did: a cycle with no output
changes nothing else, and folding the same events again, or across partitions in another order,
leaves the same state (see :mod:`services.placement.handlers`). Where a cancellation races the
job's own events inside merged batches, their order is not recorded (partitions are merged by
record timestamp); the ``gangline-batch`` header that logs now carry would tell it, unused here yet.

Grouping, reading between positions and comparing are :mod:`services.common.replay`'s, shared with
the services that decide per event.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime

from gangline.bus.positions import format_positions
from gangline.core.defaults import default_profile
from gangline.core.framework.profile import Profile
from gangline.core.pools import PoolLayout
from gangline.core.waiting import FRONT_OF_LINE
from gangline.events.allocations import AllocationGranted, AllocationReleased
from gangline.events.base import Envelope
from gangline.events.jobs import JobCancelRequested, JobPending, JobPlaced, JobResizing
from gangline.fold.cluster import FOLDED_EVENTS, POOL_FOLDED_EVENTS
from gangline.replay.log import LogRecord
from services.common.replay import (
    NO_TIME,
    Difference,
    InputIndex,
    ReplayReport,
    Transaction,
    caused,
    compare_outputs,
    decoded,
    group_transactions,
    kind_of,
    per_pool,
    unstamped_differences,
    verify_with,
)
from services.common.replay import (
    main as replay_main,
)
from services.common.topics import TopicNames
from services.placement.handlers import SOURCE, PlacementState, end_batch, fold_event

NAME = "placement-service"
"""The decider's name for `gangline replay --decider`."""

LIVE_EVENTS = frozenset(FOLDED_EVENTS) - {"allocation.granted"}
"""What the running service decodes from its inputs (its own grants it holds already)."""

PlacementReplay = ReplayReport
"""What the replay did and what differed (:class:`~services.common.replay.ReplayReport`)."""

__all__ = ["LIVE_EVENTS", "NAME", "Difference", "PlacementReplay", "PlacementReplayer", "replay_placement"]


class PlacementReplayer:
    """Replays one log; see the module docstring. ``replay()`` once per instance."""

    def __init__(
        self,
        records: Sequence[LogRecord],
        *,
        topics: TopicNames,
        gated: bool = True,
        unlimited_queues: frozenset[str] = frozenset(),
        profile: Profile | None = None,
        max_jobs_per_cycle: int = FRONT_OF_LINE,
        pooled: bool = False,
    ) -> None:
        """``pooled``: the records are one pool's (:func:`~services.common.replay.pool_records`), decided
        as a pool's placement decides: without the job.admitted events, which may be of another pool's."""
        self.topics = topics
        self._folded_events = frozenset(POOL_FOLDED_EVENTS if pooled else FOLDED_EVENTS)
        self._live_events = self._folded_events - {"allocation.granted"}
        self._gated = gated
        self._unlimited = unlimited_queues
        self._profile = profile if profile is not None else default_profile()
        self._max_jobs = max_jobs_per_cycle
        self._restore_topics = (
            topics.inventory,
            topics.health,
            topics.operator,
            topics.events,
            topics.allocations,
        )
        self._index = InputIndex(records, {*self._restore_topics, topics.heartbeats, topics.requests})
        self._output_topics = (topics.events, topics.allocations)
        self._transactions, self._unstamped = group_transactions(
            records, source=SOURCE, output_topics=self._output_topics
        )
        self._folded: dict[tuple[str, int], int] = {}
        self._state = self._new_state()
        self._incarnation: str | None = None
        self._fed = 0
        self._differences: list[Difference] = []

    def _new_state(self) -> PlacementState:
        return PlacementState(
            topics=self.topics,
            profile=self._profile,
            gated=self._gated,
            unlimited_queues=self._unlimited,
            max_jobs_per_cycle=self._max_jobs,
        )

    def replay(self) -> ReplayReport:
        runs: set[str] = set()
        compared = 0
        self._differences += unstamped_differences(self._unstamped)
        for transaction in self._transactions:
            runs.add(transaction.incarnation)
            replayed = self._replay(transaction)
            where = f"the batch with inputs up to {format_positions(transaction.positions)}"
            self._differences += compare_outputs(transaction.outputs, replayed, extra_where=where)
            compared += len(transaction.outputs)
        return ReplayReport(
            service="placement",
            transactions=len(self._transactions),
            incarnations=len(runs),
            inputs=self._fed,
            compared=compared,
            differences=self._differences,
        )

    # -- one transaction -------------------------------------------------------------------

    def _replay(self, transaction: Transaction) -> list[Envelope]:
        recorded = [decoded(r) for r in transaction.outputs]
        by_cause: dict[str, list[Envelope]] = {}
        for envelope in recorded:
            if envelope is not None and envelope.causationid is not None:
                by_cause.setdefault(envelope.causationid, []).append(envelope)
        outputs: list[Envelope] = []
        if transaction.incarnation != self._incarnation:
            self._incarnation = transaction.incarnation
            self._restart(transaction.positions)
        for record in self._between(transaction.positions):
            outputs += self._fold_live(record, by_cause)
        cycled = [e for e in recorded if e is not None and _decided_at_batch_end(e)]
        now: datetime
        if cycled:
            cause, now = cycled[0].causationid or "", cycled[0].time
            cycles = [
                e.data.cycle for e in cycled if isinstance(e.data, JobPlaced | JobPending) and e.data.cycle
            ]
            if cycles:
                self._state.cycle = min(cycles) - 1  # cycles that changed nothing are not in the log
        else:
            last = max(transaction.outputs, key=lambda r: r.offset)
            times = [e.time for e in recorded if e is not None]
            cause, now = f"(none recorded: {last.where})", max(times, default=NO_TIME)
        # The batch had outputs, so a cycle was due (a cancellation also calls for one).
        self._state.cycle_due = True
        outputs += caused(end_batch(self._state, cause=cause, now=now), cause)
        return outputs

    def _restart(self, positions: dict[tuple[str, int], int]) -> None:
        """A new run: the state is what a restore of the log up to ``positions`` gives."""
        self._state = self._new_state()
        for topic in self._restore_topics:
            for tp in self._index.of_topic(topic):
                end = positions.get(tp, self._folded.get(tp, 0))
                for record in self._index.range(tp, 0, end):
                    if kind_of(record.type) in self._folded_events:
                        envelope = decoded(record)
                        if envelope is not None:
                            self._state.restore(envelope)
                            self._fed += 1
                self._folded[tp] = max(end, self._folded.get(tp, 0))

    def _between(self, positions: dict[tuple[str, int], int]) -> Iterator[LogRecord]:
        """The records past what was folded up to ``positions``, partitions merged by record time."""
        ranges: list[Iterable[LogRecord]] = []
        for tp in sorted(self._index.partitions):
            start = self._folded.get(tp, 0)
            end = max(start, positions.get(tp, start))
            ranges.append(self._index.range(tp, start, end))
            self._folded[tp] = end
        return self._index.merged([list(r) for r in ranges])

    def _fold_live(self, record: LogRecord, by_cause: dict[str, list[Envelope]]) -> list[Envelope]:
        """One input as the live service selects and folds it; a cancellation's own outputs."""
        kind = kind_of(record.type)
        if record.topic == self.topics.requests:
            wanted = kind == JobCancelRequested.TYPE
        elif record.topic == self.topics.heartbeats:
            wanted = kind == "node.heartbeat" and self._state.needs_cycle
        else:
            wanted = kind in self._live_events or kind == AllocationGranted.TYPE
        if not wanted:
            return []
        envelope = decoded(record)
        if envelope is None:
            return []
        if isinstance(envelope.data, AllocationGranted) and envelope.data.resizes is None:
            return []  # its own grant: the live service skips it (a resize's, preemption's, it reads)
        self._fed += 1
        recorded = by_cause.get(envelope.id)
        now = recorded[0].time if recorded else envelope.time
        # A node.rejected (on nodes.health) is not among the outputs compared here: jobs and grants are.
        outputs = [o for o in fold_event(envelope, self._state, now=now) if o[0] in self._output_topics]
        return caused(outputs, envelope.id)


def _decided_at_batch_end(envelope: Envelope) -> bool:
    """An output of ``end_batch``: a cycle's decision, or the release of a job that ended."""
    data = envelope.data
    if isinstance(data, AllocationReleased):
        return data.reason in ("completed", "failed")  # a cancellation's release is its own event's
    return isinstance(data, JobPlaced | JobPending | JobResizing)


def replay_placement(
    records: Sequence[LogRecord],
    *,
    topics: TopicNames | None = None,
    gated: bool = True,
    unlimited_queues: frozenset[str] | None = None,
    profile: Profile | None = None,
    max_jobs_per_cycle: int = FRONT_OF_LINE,
    pools: PoolLayout | None = None,
) -> PlacementReplay:
    """Re-run placement's handlers over the recorded inputs; every difference in its outputs, in order.

    ``unlimited_queues``: the queues the run's queues file marked unlimited (None: the configuration
    without a file, where only ``default`` is). With ``pools`` each pool is replayed on its own, over its
    partitions, as its owners decided it (:func:`~services.common.replay.per_pool`).
    """
    if unlimited_queues is None:
        from services.common.queues import unlimited_queues as read_unlimited

        unlimited_queues = read_unlimited(None)
    names = topics if topics is not None else TopicNames()

    def replay(view: Sequence[LogRecord], pooled: bool = False) -> ReplayReport:
        return PlacementReplayer(
            view,
            topics=names,
            gated=gated,
            unlimited_queues=unlimited_queues,
            profile=profile,
            max_jobs_per_cycle=max_jobs_per_cycle,
            pooled=pooled,
        ).replay()

    if pools is None:
        return replay(records)
    return per_pool(records, names, pools, lambda view: replay(view, pooled=True))


def decider_topics(prefix: str) -> list[str]:
    """Every topic the replay reads under ``prefix``: placement's inputs (its outputs are on two of them)."""
    topics = TopicNames(prefix=prefix)
    return [
        topics.inventory,
        topics.health,
        topics.operator,
        topics.events,
        topics.allocations,
        topics.heartbeats,
        topics.requests,
    ]


def replay_log(records: Sequence[LogRecord], *, prefix: str, gated: bool) -> ReplayReport:
    """Placement's replay under ``prefix``, with the profile and cycle size it reads (``GANGLINE_*``)."""
    from gangline.core.defaults import placement_registry
    from gangline.core.framework.profile import load_profile_file
    from services.common.queues import unlimited_queues
    from services.placement.settings import PlacementSettings

    settings = PlacementSettings.from_env(topic_prefix=prefix)
    profile = (
        load_profile_file(settings.profile_path, placement_registry()) if settings.profile_path else None
    )
    return replay_placement(
        records,
        topics=TopicNames(prefix=prefix),
        gated=gated,
        unlimited_queues=unlimited_queues(settings.queues_file),
        profile=profile,
        max_jobs_per_cycle=settings.max_jobs_per_cycle,
        pools=settings.pool_layout,
    )


def verify_decisions(records: Sequence[LogRecord], *, prefix: str, gated: bool, max_problems: int) -> bool:
    """`gangline replay --verify --decider placement-service`: replay, print the report; True if identical."""
    return verify_with(replay_log, records, prefix=prefix, gated=gated, max_problems=max_problems)


def main(argv: Sequence[str] | None = None) -> int:
    """0: identical; 1: an output differs; 2: unusable input."""
    return replay_main(
        argv, prog="python -m services.placement.replay", topics=decider_topics, replay_log=replay_log
    )


if __name__ == "__main__":
    raise SystemExit(main())
