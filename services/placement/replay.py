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
3. run the batch's cycle with the recorded cause and ``now`` (the time on its outputs: ``now`` only
   stamps envelopes), and compare every output with the recorded one: event id, type, subject,
   time, cause and every field of the payload (job, allocation, ranks, nodes, GPUs, score, reasons).

The cycle number counts cycles, and cycles that changed nothing leave no trace in the log: each
batch's first cycle number is taken from its recorded outputs (decisions do not depend on it).
Batches that decided nothing are folded into the next batch that did: a cycle with no output
changes nothing else, and folding the same events again, or across partitions in another order,
leaves the same state (see :mod:`services.placement.handlers`). Where a cancellation races the
job's own events inside merged batches, their order is not recorded (partitions are merged by
record timestamp).
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gangline.bus import Outgoing
from gangline.bus.positions import (
    INCARNATION_HEADER,
    INPUTS_HEADER,
    Partition,
    format_positions,
    parse_positions,
)
from gangline.core.defaults import default_profile
from gangline.core.framework.profile import Profile
from gangline.events.base import Envelope
from gangline.events.codec import DecodeError, decode, dumps, encode
from gangline.events.jobs import JobCancelRequested, JobPending, JobPlaced
from gangline.replay.log import FileSource, LogFormatError, LogRecord, LogSource
from services.common.topics import TopicNames
from services.placement.handlers import SOURCE, PlacementState, end_batch, fold_event
from services.placement.wiring import PLACEMENT_EVENTS

NAME = "placement-service"
"""The decider's name for `gangline replay --decider`."""

LIVE_EVENTS = frozenset(PLACEMENT_EVENTS) - {"allocation.granted"}
"""What the running service decodes from its inputs (its own grants it holds already)."""
NO_TIME = datetime(1970, 1, 1, tzinfo=UTC)
"""``now`` for a batch none of whose recorded outputs can be read (each is reported as it is)."""
IGNORED_ATTRIBUTES = frozenset({"traceparent"})
"""Envelope attributes not compared: the trace context of the run, not part of the decision."""


@dataclass(frozen=True, slots=True)
class Difference:
    """One output the replay decided differently, did not decide, or decided in addition."""

    where: str
    """The recorded output's position (``topic[partition]@offset``), or what the replay would have sent."""
    job_id: str
    field: str
    recorded: str
    replayed: str

    @property
    def message(self) -> str:
        return (
            f"{self.where} job {self.job_id or '-'}: {self.field}: recorded {self.recorded}, "
            f"replayed {self.replayed}"
        )


@dataclass(frozen=True, slots=True)
class PlacementReplay:
    """What the replay did and what differed (in log order: the first difference first)."""

    transactions: int
    """Recorded placement transactions (batches with outputs) replayed."""
    incarnations: int
    """Process runs seen (each a restore from the log)."""
    inputs: int
    """Input records folded."""
    compared: int
    """Recorded outputs compared with the replayed ones."""
    differences: list[Difference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    @property
    def first(self) -> Difference | None:
        return self.differences[0] if self.differences else None

    def summary(self) -> str:
        verdict = "identical" if self.ok else f"{len(self.differences)} difference(s)"
        return (
            f"placement decisions: {self.transactions} transactions in {self.incarnations} run(s), "
            f"{self.inputs} inputs folded, {self.compared} outputs compared with the log: {verdict}"
        )


@dataclass(slots=True)
class _Transaction:
    incarnation: str
    positions: dict[Partition, int]
    outputs: list[LogRecord] = field(default_factory=list)

    @property
    def order(self) -> tuple[int, int]:
        return (sum(self.positions.values()), min(r.offset for r in self.outputs))


def _kind(wire_type: str) -> str:
    """``gangline.job.admitted.v1`` → ``job.admitted`` ('' when not a Gangline type)."""
    parts = wire_type.split(".")
    return ".".join(parts[1:-1]) if len(parts) > 2 and parts[0] == "gangline" else ""


def _decode(record: LogRecord) -> Envelope | None:
    try:
        return decode(dumps(record.envelope))
    except DecodeError:
        return None


def _comparable(envelope: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in envelope.items() if k not in IGNORED_ATTRIBUTES}


def _first_difference(recorded: Any, replayed: Any, path: str) -> tuple[str, Any, Any] | None:
    """The first path at which two JSON values differ, with both values there."""
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        for key in sorted(set(recorded) | set(replayed)):
            found = _first_difference(recorded.get(key), replayed.get(key), f"{path}.{key}" if path else key)
            if found is not None:
                return found
        return None
    if isinstance(recorded, list) and isinstance(replayed, list) and len(recorded) == len(replayed):
        for k, (a, b) in enumerate(zip(recorded, replayed, strict=True)):
            found = _first_difference(a, b, f"{path}[{k}]")
            if found is not None:
                return found
        return None
    return None if recorded == replayed else (path, recorded, replayed)


def _show(value: Any) -> str:
    return "absent" if value is None else json.dumps(value, sort_keys=True)


def _job_of(envelope: dict[str, Any]) -> str:
    data = envelope.get("data")
    job = data.get("job_id") if isinstance(data, dict) else None
    return str(job) if job is not None else str(envelope.get("subject", ""))


class PlacementReplayer:
    """Replays one log; see the module docstring. ``replay()`` once per instance."""

    def __init__(
        self,
        records: Sequence[LogRecord],
        *,
        topics: TopicNames,
        gated: bool = True,
        profile: Profile | None = None,
        max_jobs_per_cycle: int = 256,
    ) -> None:
        self.topics = topics
        self._gated = gated
        self._profile = profile if profile is not None else default_profile()
        self._max_jobs = max_jobs_per_cycle
        self._restore_topics = (topics.inventory, topics.health, topics.events, topics.allocations)
        read = {*self._restore_topics, topics.heartbeats, topics.requests}
        outputs_on = {topics.events, topics.allocations}
        self._inputs: dict[Partition, list[LogRecord]] = {}
        self._unstamped: list[LogRecord] = []
        transactions: dict[tuple[str, str], _Transaction] = {}
        for r in records:
            if r.topic in outputs_on and r.envelope.get("source") == SOURCE:
                inputs, run = r.headers.get(INPUTS_HEADER), r.headers.get(INCARNATION_HEADER)
                if inputs is None or run is None:
                    self._unstamped.append(r)
                else:
                    key = (run, inputs)
                    if key not in transactions:
                        transactions[key] = _Transaction(run, parse_positions(inputs))
                    transactions[key].outputs.append(r)
            if r.topic in read:
                self._inputs.setdefault((r.topic, r.partition), []).append(r)
        for partition in self._inputs.values():
            partition.sort(key=lambda r: r.offset)
        self._transactions = sorted(transactions.values(), key=lambda t: t.order)
        self._folded: dict[Partition, int] = {}
        self._state = self._new_state()
        self._incarnation: str | None = None
        self._fed = 0
        self._differences: list[Difference] = []

    def _new_state(self) -> PlacementState:
        return PlacementState(
            topics=self.topics, profile=self._profile, gated=self._gated, max_jobs_per_cycle=self._max_jobs
        )

    def replay(self) -> PlacementReplay:
        runs: set[str] = set()
        compared = 0
        for r in self._unstamped:
            self._differences.append(
                Difference(
                    r.where, _job_of(r.envelope), "headers", "no input positions", "cannot be replayed"
                )
            )
        for transaction in self._transactions:
            runs.add(transaction.incarnation)
            replayed = self._replay(transaction)
            self._compare(transaction, replayed)
            compared += len(transaction.outputs)
        return PlacementReplay(
            transactions=len(self._transactions),
            incarnations=len(runs),
            inputs=self._fed,
            compared=compared,
            differences=self._differences,
        )

    # -- one transaction -------------------------------------------------------------------

    def _replay(self, transaction: _Transaction) -> list[Envelope]:
        recorded = [_decode(r) for r in transaction.outputs]
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
        cycled = [e for e in recorded if e is not None and isinstance(e.data, JobPlaced | JobPending)]
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
        outputs += _caused(end_batch(self._state, cause=cause, now=now), cause)
        return outputs

    def _restart(self, positions: dict[Partition, int]) -> None:
        """A new run: the state is what a restore of the log up to ``positions`` gives."""
        self._state = self._new_state()
        for topic in self._restore_topics:
            for (t, p), records in sorted(self._inputs.items()):
                if t != topic:
                    continue
                end = positions.get((t, p), self._folded.get((t, p), 0))
                for record in records:
                    if record.offset >= end:
                        break
                    if _kind(record.type) in PLACEMENT_EVENTS:
                        envelope = _decode(record)
                        if envelope is not None:
                            self._state.restore(envelope)
                            self._fed += 1
                self._folded[(t, p)] = max(end, self._folded.get((t, p), 0))

    def _between(self, positions: dict[Partition, int]) -> Iterator[LogRecord]:
        """The records past what was folded up to ``positions``, partitions merged by record time."""
        ranges: list[Iterable[LogRecord]] = []
        for tp, records in sorted(self._inputs.items()):
            start = self._folded.get(tp, 0)
            end = max(start, positions.get(tp, start))
            first = bisect.bisect_left(records, start, key=lambda r: r.offset)
            last = bisect.bisect_left(records, end, key=lambda r: r.offset)
            ranges.append(records[first:last])
            self._folded[tp] = end
        yield from heapq.merge(*ranges, key=lambda r: r.timestamp_ms or 0)

    def _fold_live(self, record: LogRecord, by_cause: dict[str, list[Envelope]]) -> list[Envelope]:
        """One input as the live service selects and folds it; a cancellation's own outputs."""
        kind = _kind(record.type)
        if record.topic == self.topics.requests:
            wanted = kind == JobCancelRequested.TYPE
        elif record.topic == self.topics.heartbeats:
            wanted = kind == "node.heartbeat" and self._state.needs_cycle
        else:
            wanted = kind in LIVE_EVENTS
        if not wanted:
            return []
        envelope = _decode(record)
        if envelope is None:
            return []
        self._fed += 1
        caused = by_cause.get(envelope.id)
        now = caused[0].time if caused else envelope.time
        return list(_caused(fold_event(envelope, self._state, now=now), envelope.id))

    def _compare(self, transaction: _Transaction, replayed: list[Envelope]) -> None:
        mine = {e.id: _comparable(json.loads(encode(e))) for e in replayed}
        for record in sorted(transaction.outputs, key=lambda r: (r.topic, r.partition, r.offset)):
            want = _comparable(dict(record.envelope))
            got = mine.pop(record.event_id, None)
            job = _job_of(want)
            if got is None:
                self._differences.append(
                    Difference(record.where, job, want.get("type", "?"), "sent", "not decided by the replay")
                )
                continue
            found = _first_difference(want, got, "")
            if found is not None:
                path, a, b = found
                self._differences.append(Difference(record.where, job, path, _show(a), _show(b)))
        where = f"the batch with inputs up to {format_positions(transaction.positions)}"
        for extra in mine.values():
            self._differences.append(
                Difference(
                    where, _job_of(extra), str(extra.get("type")), "not in the log", f"id {extra.get('id')}"
                )
            )


def _caused(outputs: Sequence[Outgoing], cause: str) -> Iterator[Envelope]:
    """The outputs as the processor sends them: each names the consumed event as its cause."""
    for _, envelope in outputs:
        yield envelope.model_copy(update={"causationid": cause})


def replay_placement(
    records: Sequence[LogRecord],
    *,
    topics: TopicNames | None = None,
    gated: bool = True,
    profile: Profile | None = None,
    max_jobs_per_cycle: int = 256,
) -> PlacementReplay:
    """Re-run placement's handlers over the recorded inputs; every difference in its outputs, in order."""
    return PlacementReplayer(
        records,
        topics=topics if topics is not None else TopicNames(),
        gated=gated,
        profile=profile,
        max_jobs_per_cycle=max_jobs_per_cycle,
    ).replay()


def decider_topics(prefix: str) -> list[str]:
    """Every topic the replay reads under ``prefix``: placement's inputs (its outputs are on two of them)."""
    topics = TopicNames(prefix=prefix)
    return [
        topics.inventory,
        topics.health,
        topics.events,
        topics.allocations,
        topics.heartbeats,
        topics.requests,
    ]


def verify_decisions(records: Sequence[LogRecord], *, prefix: str, gated: bool, max_problems: int) -> bool:
    """`gangline replay --verify --decider placement-service`: replay, print the report; True if identical."""
    result = replay_placement(records, topics=TopicNames(prefix=prefix), gated=gated)
    print(result.summary())
    for d in result.differences[:max_problems]:
        print(f"  difference: {d.message}")
    return result.ok


def main(argv: Sequence[str] | None = None) -> int:
    """0: identical; 1: an output differs; 2: unusable input."""
    p = argparse.ArgumentParser(
        prog="python -m services.placement.replay", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--from", dest="source", required=True, help="a JSONL file from `gangline export`, or kafka"
    )
    p.add_argument("--bootstrap", help="with --from kafka: host:port")
    p.add_argument("--prefix", default="", help="the topic name prefix the services ran with")
    p.add_argument("--ungated", action="store_true", help="the service ran with gated=false")
    p.add_argument("--max-problems", type=int, default=20)
    args = p.parse_args(argv)
    source: LogSource
    if args.source == "kafka":
        from gangline.replay.kafka import KafkaSource

        source = KafkaSource(args.bootstrap)
    else:
        source = FileSource(args.source)
    try:
        records = source.records(decider_topics(args.prefix) if args.source == "kafka" else None)
    except (OSError, LogFormatError, LookupError, TimeoutError) as e:
        print(f"placement replay: {e}", file=sys.stderr)
        return 2
    ok = verify_decisions(records, prefix=args.prefix, gated=not args.ungated, max_problems=args.max_problems)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
