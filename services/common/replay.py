"""Re-run a decision service's handlers over the inputs it recorded, and check every output equals the log.

    gangline replay --from log.jsonl|kafka --verify --decider all|admission|quota|preemption|node-health
    python -m services.<name>.replay --from log.jsonl|kafka [--prefix P]

A service run with ``record_inputs`` stamps every output of a transaction with Kafka headers
(:mod:`gangline.bus.positions`): its run (``gangline-incarnation``), the cumulative input positions
(``gangline-inputs``), what the batch consumed in the order it was handled (``gangline-batch``), and,
on the first transaction with outputs of a run, where the restore from the log stopped
(``gangline-restored``), where the consumer resumed (``gangline-resumed``) and when the state was
created (``gangline-started``). This module holds
what every service's replay shares:

* :func:`group_transactions`: a service's outputs (its ``source``) grouped by run and positions, in
  log order; outputs without the headers cannot be replayed and are reported as such;
* :class:`InputIndex`: the recorded inputs per partition, read between positions;
* :func:`compare_outputs`: recorded against replayed outputs, field by field, each difference named
  by position, job (or subject) and field (``data.placements[0].gpus[1]``);
* :class:`EventReplayer`: the replay of a service that decides **per event** (admission, quota,
  preemption, node_health), given its :class:`ServiceModel`;
* the command-line plumbing (:func:`verify_decisions` for ``--decider all``, :func:`report`, :func:`main`).

How a per-event service is replayed (what :class:`EventReplayer` guarantees)
------------------------------------------------------------------------------
A service's outputs depend on the order it handled its inputs, within and across batches. For each
recorded transaction, in log order:

1. **A new run** (a new incarnation) starts from a fresh state (``started`` from the header) and is
   restored from the restore topics, each topic in turn, up to the recorded restore positions, as
   the shell's restore does. The live consumer then re-reads what the restore had folded past its
   committed offsets; those records come again in the exact batch ranges below, so nothing is lost.
   The other inputs (requests, heartbeats) are read from where the run's consumer resumed.
2. **The records between two transactions** (batches that produced nothing leave no header) are
   handled in record-time order across partitions, each partition in offset order, *quietly*: with
   ``now`` the event's own time (a lower bound of the live clock) and every output they produce
   reported as a decision the log does not hold. Their batch boundaries and cross-partition order
   are not recorded: a state fold that depends on that order can make the replay differ where the
   live run did not (each service's replay says which of its folds are order-independent).
3. **The batch itself** is handled exactly: its partitions in the order the processor handled them,
   each partition's records in offset order, selected as the live ``select`` selects them. An event
   that the recorded outputs name as their cause (``causationid``) is handled with ``now`` = those
   outputs' time; the others quietly. Events handled again within a run (the same event id) get the
   outputs of their first handling, as the shell's :class:`~services.common.shell.Replayed` cache
   gives them (the last ``remember`` events': 10,000, as the shell keeps with batches of up to 2,500).
   A service that also decides once per batch (preemption) decides after the batch's last event,
   with the latest time of the outputs that event caused.
4. **Every output is compared** with the recorded one by event id: type, subject, time, cause and
   every field of the payload; the trace context is not compared. A recorded output the replay did
   not decide, and a replayed output the log does not hold, are differences too.

An input the processor could not decode is dead-lettered again the same way (same code and reason),
and a service that publishes something about it (admission's rejection) decides it again from that;
outputs naming no cause that the replay does not decide are counted as unverified, not compared.

What it does not verify: decisions the live run did not take because of the wall clock where the
replay cannot know the clock (see node_health's replay), and the order-dependent folds named above.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import importlib
import json
import sys
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar, cast

from gangline.bus import DeadLetter, Outgoing
from gangline.bus.consumer import decode_or_dead_letter
from gangline.bus.positions import (
    BATCH_HEADER,
    INCARNATION_HEADER,
    INPUTS_HEADER,
    RESTORED_HEADER,
    RESUMED_HEADER,
    STARTED_HEADER,
    BatchRange,
    Partition,
    format_positions,
    parse_batch,
    parse_positions,
)
from gangline.core.pools import PoolLayout
from gangline.events.base import Envelope
from gangline.events.codec import DecodeError, decode, dumps, encode
from gangline.replay.log import FileSource, LogFormatError, LogRecord, LogSource
from services.common.ids import Fingerprint, fingerprint
from services.common.topics import TopicNames

IGNORED_ATTRIBUTES = frozenset({"traceparent"})
"""Envelope attributes not compared: the trace context of the run, not part of the decision."""
NO_TIME = datetime(1970, 1, 1, tzinfo=UTC)
"""``now`` when none can be read from the log (each unreadable output is reported as it is)."""


# -- what a replay reports -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Difference:
    """One output the replay decided differently, did not decide, or decided in addition."""

    where: str
    """The recorded output's position (``topic[partition]@offset``), or what the replay would have sent."""
    job_id: str
    """The job the output is about (its subject when it names no job: a node)."""
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
class ReplayReport:
    """What a service's replay did and what differed (in log order: the first difference first)."""

    service: str
    transactions: int
    """Recorded transactions (batches with outputs) replayed."""
    incarnations: int
    """Process runs seen (each a restore from the log)."""
    inputs: int
    """Input records folded or handled."""
    compared: int
    """Recorded outputs compared with the replayed ones."""
    differences: list[Difference] = field(default_factory=list)
    unverified: int = 0
    """Recorded outputs about unreadable inputs (dead letters): counted, not compared."""

    @property
    def ok(self) -> bool:
        return not self.differences

    @property
    def first(self) -> Difference | None:
        return self.differences[0] if self.differences else None

    def summary(self) -> str:
        verdict = "identical" if self.ok else f"{len(self.differences)} difference(s)"
        unverified = f", {self.unverified} about unreadable inputs not verified" if self.unverified else ""
        return (
            f"{self.service} decisions: {self.transactions} transactions in {self.incarnations} run(s), "
            f"{self.inputs} inputs folded, {self.compared} outputs compared with the log{unverified}: "
            f"{verdict}"
        )


# -- reading the log -------------------------------------------------------------------------------


def kind_of(wire_type: str) -> str:
    """``gangline.job.admitted.v1`` → ``job.admitted`` ('' when not a Gangline type)."""
    parts = wire_type.split(".")
    return ".".join(parts[1:-1]) if len(parts) > 2 and parts[0] == "gangline" else ""


def decoded(record: LogRecord) -> Envelope | None:
    """The record's event, or None when it does not decode (the processor dead-letters it)."""
    try:
        return decode(dumps(record.envelope))
    except DecodeError:
        return None


@dataclass(frozen=True, slots=True)
class RecordView:
    """A recorded message as the bus's consumer sees one (:class:`~gangline.bus.records.KafkaRecord`)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]

    @classmethod
    def of(cls, record: LogRecord) -> RecordView:
        return cls(
            record.topic,
            record.partition,
            record.offset,
            record.timestamp_ms or 0,
            record.key.encode() if record.key is not None else None,
            dumps(record.envelope),
            tuple((k, v.encode()) for k, v in record.headers.items()),
        )


def dead_letter_of(record: LogRecord, service: str) -> DeadLetter | None:
    """The dead letter the processor made of a record it could not decode (None when it decodes)."""
    outcome = decode_or_dead_letter(RecordView.of(record), registry=None, source_service=service)
    return outcome if isinstance(outcome, DeadLetter) else None


@dataclass(slots=True)
class Transaction:
    """The outputs of one recorded transaction and what their headers say about its inputs."""

    incarnation: str
    positions: dict[Partition, int]
    batch: list[BatchRange] | None = None
    """What the batch consumed, in handling order (absent in logs written before it was recorded)."""
    restored: dict[Partition, int] | None = None
    resumed: dict[Partition, int] | None = None
    """Where the run's consumer resumed each partition (recorded with ``restored``)."""
    started: datetime | None = None
    outputs: list[LogRecord] = field(default_factory=list)

    @property
    def order(self) -> tuple[int, int]:
        """Its place among the transactions of its run: the positions only grow within one run."""
        return (sum(self.positions.values()), min(r.offset for r in self.outputs))

    @property
    def first_written_ms(self) -> int:
        return min(r.timestamp_ms or 0 for r in self.outputs)

    def merge_headers(self, headers: dict[str, str]) -> None:
        """Take the optional headers from whichever output of the transaction carries them."""
        if self.batch is None and BATCH_HEADER in headers:
            self.batch = parse_batch(headers[BATCH_HEADER])
        if self.restored is None and RESTORED_HEADER in headers:
            self.restored = parse_positions(headers[RESTORED_HEADER])
        if self.resumed is None and RESUMED_HEADER in headers:
            self.resumed = parse_positions(headers[RESUMED_HEADER])
        if self.started is None and STARTED_HEADER in headers:
            self.started = datetime.fromisoformat(headers[STARTED_HEADER])


def group_transactions(
    records: Iterable[LogRecord], *, source: str, output_topics: Iterable[str]
) -> tuple[list[Transaction], list[LogRecord]]:
    """The outputs of ``source`` grouped by run and input positions, in log order; and those unstamped."""
    outputs_on = frozenset(output_topics)
    transactions: dict[tuple[str, str], Transaction] = {}
    unstamped: list[LogRecord] = []
    for r in records:
        if r.topic not in outputs_on or r.envelope.get("source") != source:
            continue
        inputs, run = r.headers.get(INPUTS_HEADER), r.headers.get(INCARNATION_HEADER)
        if inputs is None or run is None:
            unstamped.append(r)
            continue
        key = (run, inputs)
        transaction = transactions.get(key)
        if transaction is None:
            transaction = transactions[key] = Transaction(run, parse_positions(inputs))
        transaction.merge_headers(dict(r.headers))
        transaction.outputs.append(r)
    # Runs one after the other, each in the order of its positions. Positions are no order across runs:
    # a run that has not read a topic yet (requests, heartbeats) has none for it, so its sums start
    # lower than its predecessor's last ones, and sorting every transaction by them interleaved the two
    # runs (each switch a restart from the restore).
    began: dict[str, int] = {}
    for t in transactions.values():
        began[t.incarnation] = min(began.get(t.incarnation, t.first_written_ms), t.first_written_ms)
    return sorted(
        transactions.values(), key=lambda t: (began[t.incarnation], t.incarnation, t.order)
    ), unstamped


def unstamped_differences(unstamped: Iterable[LogRecord]) -> list[Difference]:
    return [
        Difference(r.where, job_of(r.envelope), "headers", "no input positions", "cannot be replayed")
        for r in unstamped
    ]


class InputIndex:
    """The recorded records of the input topics, per partition in offset order."""

    def __init__(self, records: Iterable[LogRecord], topics: Iterable[str]) -> None:
        wanted = frozenset(topics)
        self.partitions: dict[Partition, list[LogRecord]] = {}
        for r in records:
            if r.topic in wanted:
                self.partitions.setdefault((r.topic, r.partition), []).append(r)
        for partition in self.partitions.values():
            partition.sort(key=lambda r: r.offset)

    def range(self, tp: Partition, start: int, end: int) -> list[LogRecord]:
        """The records of ``tp`` with ``start <= offset < end``."""
        records = self.partitions.get(tp, [])
        first = bisect.bisect_left(records, start, key=lambda r: r.offset)
        last = bisect.bisect_left(records, end, key=lambda r: r.offset)
        return records[first:last]

    def of_topic(self, topic: str) -> list[Partition]:
        return sorted(tp for tp in self.partitions if tp[0] == topic)

    def merged(self, ranges: Iterable[Sequence[LogRecord]]) -> Iterator[LogRecord]:
        """Several partitions' records merged by record time (each partition stays in offset order)."""
        return heapq.merge(*ranges, key=lambda r: r.timestamp_ms or 0)


# -- comparing -------------------------------------------------------------------------------------


def comparable(envelope: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in envelope.items() if k not in IGNORED_ATTRIBUTES}


def first_difference(recorded: Any, replayed: Any, path: str) -> tuple[str, Any, Any] | None:
    """The first path at which two JSON values differ, with both values there."""
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        for key in sorted(set(recorded) | set(replayed)):
            found = first_difference(recorded.get(key), replayed.get(key), f"{path}.{key}" if path else key)
            if found is not None:
                return found
        return None
    if isinstance(recorded, list) and isinstance(replayed, list) and len(recorded) == len(replayed):
        for k, (a, b) in enumerate(zip(recorded, replayed, strict=True)):
            found = first_difference(a, b, f"{path}[{k}]")
            if found is not None:
                return found
        return None
    if recorded == replayed:
        return None
    return (path, recorded, replayed)


def show(value: Any) -> str:
    return "absent" if value is None else json.dumps(value, sort_keys=True)


def job_of(envelope: dict[str, Any]) -> str:
    data = envelope.get("data")
    job = data.get("job_id") if isinstance(data, dict) else None
    return str(job) if job is not None else str(envelope.get("subject", ""))


def compare_outputs(
    recorded: Sequence[LogRecord], replayed: Iterable[Envelope], *, extra_where: str
) -> list[Difference]:
    """Each recorded output against the replayed one with the same id; then the replayed ones left over."""
    mine: dict[str, list[dict[str, Any]]] = {}
    for envelope in replayed:
        mine.setdefault(envelope.id, []).append(comparable(json.loads(encode(envelope))))
    out: list[Difference] = []
    for record in sorted(recorded, key=lambda r: (r.topic, r.partition, r.offset)):
        want = comparable(dict(record.envelope))
        same_id = mine.get(record.event_id)
        job = job_of(want)
        if not same_id:
            out.append(
                Difference(record.where, job, want.get("type", "?"), "sent", "not decided by the replay")
            )
            continue
        got = same_id.pop(0)
        found = first_difference(want, got, "")
        if found is not None:
            path, a, b = found
            out.append(Difference(record.where, job, path, show(a), show(b)))
    for left in mine.values():
        for extra in left:
            out.append(
                Difference(
                    extra_where,
                    job_of(extra),
                    str(extra.get("type")),
                    "not in the log",
                    f"id {extra.get('id')}",
                )
            )
    return out


def caused(outputs: Iterable[Outgoing], cause: str) -> list[Envelope]:
    """The outputs as the processor sends them: each names the consumed event as its cause."""
    return [envelope.model_copy(update={"causationid": cause}) for _, envelope in outputs]


# -- replaying a service that decides per event ----------------------------------------------------

S = TypeVar("S")


class ServiceModel(ABC, Generic[S]):
    """How one service is run by its shell, for :class:`EventReplayer` (pure; no I/O).

    ``handle`` is given the recorded outputs the event caused (``caused``, empty when none): it
    decides with their time as ``now``, or, when there are none, *quietly* (with a ``now`` that cannot
    make it decide what the live run could not have; see each service's replay).
    """

    name: str
    """The service, as reports name it ("quota")."""
    source: str
    """The ``source`` of the envelopes it writes."""
    topics: TopicNames

    @property
    @abstractmethod
    def output_topics(self) -> tuple[str, ...]: ...

    @property
    @abstractmethod
    def live_topics(self) -> tuple[str, ...]:
        """What its processor consumes."""

    @property
    @abstractmethod
    def restore_topics(self) -> tuple[str, ...]:
        """What its start restores the state from, in that order."""

    @abstractmethod
    def new_state(self, started: datetime | None) -> S: ...

    def restores(self, kind: str) -> bool:
        """Whether the restore folds an event of this type (its ``restore_select``)."""
        return True

    def selects(self, state: S, record: LogRecord, kind: str) -> bool:
        """Whether the live ``select`` hands this record to the handler (asked just before handling it)."""
        return True

    @abstractmethod
    def restore(self, state: S, envelope: Envelope) -> None: ...

    @abstractmethod
    def handle(self, state: S, envelope: Envelope, caused: Sequence[Envelope]) -> Sequence[Outgoing]: ...

    def end_batch(self, state: S, last: Envelope, caused: Sequence[Envelope]) -> Sequence[Outgoing]:
        """The once-per-batch decision after ``last`` (the batch's last handled event); none by default."""
        return []

    def unreadable(self, state: S, letter: DeadLetter, uncaused: Sequence[Envelope]) -> Sequence[Outgoing]:
        """What the processor's ``dead_letter_outputs`` published about a record it could not decode.

        ``uncaused``: the transaction's recorded outputs that name no cause (those are sent so). None
        by default.
        """
        return []

    def after_quiet_batches(self, state: S) -> None:
        """After the records between two transactions: what those batches' own ``end_batch`` left.

        Each of them decided nothing (it left no outputs), which a service may take as a fact.
        """


def earliest(envelopes: Sequence[Envelope]) -> datetime | None:
    return min((e.time for e in envelopes), default=None)


def latest(envelopes: Sequence[Envelope]) -> datetime | None:
    return max((e.time for e in envelopes), default=None)


class EventReplayer(Generic[S]):
    """Replays one service from one log; see the module docstring. ``replay()`` once per instance."""

    def __init__(
        self, model: ServiceModel[S], records: Sequence[LogRecord], *, remember: int = 10_000
    ) -> None:
        self.model = model
        self._remember = remember
        self._transactions, self._unstamped = group_transactions(
            records, source=model.source, output_topics=model.output_topics
        )
        self._index = InputIndex(records, {*model.live_topics, *model.restore_topics})
        self._consumed: dict[Partition, int] = {}
        self._incarnation: str | None = None
        self._state: S = model.new_state(None)
        self._handled: OrderedDict[str, tuple[Fingerprint, list[Envelope]]] = OrderedDict()
        """This run's outputs per event id, the last ``remember`` events' (the shell's :class:`Replayed`)."""
        self._fed = 0
        self._differences: list[Difference] = []
        self._unverified = 0

    def replay(self) -> ReplayReport:
        self._differences += unstamped_differences(self._unstamped)
        runs: set[str] = set()
        compared = 0
        for transaction in self._transactions:
            runs.add(transaction.incarnation)
            replayed, quiet = self._replay(transaction)
            where = f"the batch with inputs up to {format_positions(transaction.positions)}"
            outputs = transaction.outputs
            unreadable = [r for r in outputs if r.envelope.get("causationid") is None]
            if unreadable and transaction.batch is not None:
                # Outputs about dead-lettered inputs name no cause: there is no event to decide them from.
                ids = {e.id for e in replayed}
                skipped = [r for r in unreadable if r.event_id not in ids]
                self._unverified += len(skipped)
                outputs = [r for r in outputs if r not in skipped]
            self._differences += compare_outputs(outputs, [*quiet, *replayed], extra_where=where)
            compared += len(outputs)
        return ReplayReport(
            service=self.model.name,
            transactions=len(self._transactions),
            incarnations=len(runs),
            inputs=self._fed,
            compared=compared,
            differences=self._differences,
            unverified=self._unverified,
        )

    def _replay(self, transaction: Transaction) -> tuple[list[Envelope], list[Envelope]]:
        """The transaction's outputs as replayed, and what the records before it decided (quietly)."""
        by_cause: dict[str, list[Envelope]] = {}
        for record in transaction.outputs:
            envelope = decoded(record)
            if envelope is not None and envelope.causationid is not None:
                by_cause.setdefault(envelope.causationid, []).append(envelope)
        batch = transaction.batch
        if batch is None:
            # Written before batches were recorded: everything up to the positions, one batch.
            batch = [
                (t, p, self._consumed.get((t, p), 0), end)
                for (t, p), end in sorted(transaction.positions.items())
                if t in self.model.live_topics
            ]
        if transaction.incarnation != self._incarnation:
            self._restart(transaction, batch)
        quiet = self._between(transaction, batch)
        self.model.after_quiet_batches(self._state)
        uncaused = [e for e in map(decoded, transaction.outputs) if e is not None and e.causationid is None]
        replayed: list[Envelope] = []
        last: Envelope | None = None
        for topic, partition, first, end in batch:
            for record in self._index.range((topic, partition), first, end):
                selected = self._select(record)
                if isinstance(selected, DeadLetter):
                    replayed += [e for _, e in self.model.unreadable(self._state, selected, uncaused)]
                elif selected is not None:
                    where = fingerprint(selected, record.topic, record.partition, record.offset)
                    replayed += self._handle(selected, where, by_cause.get(selected.id, []))
                    last = selected
            tp = (topic, partition)
            self._consumed[tp] = max(self._consumed.get(tp, 0), end)
        if last is not None:
            outputs = caused(self.model.end_batch(self._state, last, by_cause.get(last.id, [])), last.id)
            done = self._handled.get(last.id)
            if done is not None:
                self._handled[last.id] = (done[0], [*done[1], *outputs])
            replayed += outputs
        return replayed, quiet

    def _select(self, record: LogRecord) -> Envelope | DeadLetter | None:
        """The event the live processor handed the handler; the dead letter it made instead; or None."""
        if not self.model.selects(self._state, record, kind_of(record.type)):
            return None
        envelope = decoded(record)
        return envelope if envelope is not None else dead_letter_of(record, self.model.name)

    def _handle(self, envelope: Envelope, where: Fingerprint, recorded: list[Envelope]) -> list[Envelope]:
        done = self._handled.get(envelope.id)
        if done is not None and done[0] == where:
            return list(done[1])
        self._fed += 1
        outputs = caused(self.model.handle(self._state, envelope, recorded), envelope.id)
        self._handled[envelope.id] = (where, outputs)
        if len(self._handled) > self._remember:
            self._handled.popitem(last=False)
        return outputs

    def _restart(self, transaction: Transaction, batch: list[BatchRange]) -> None:
        """A new run: a fresh state restored from the log up to where the run's restore stopped."""
        self._incarnation = transaction.incarnation
        self._handled = OrderedDict()
        started = transaction.started
        if started is None:  # not recorded: no later than the run's first outputs
            started = earliest([e for e in map(decoded, transaction.outputs) if e is not None])
        self._state = self.model.new_state(started)
        restored = transaction.restored
        if restored is None:
            # Not recorded (a log written before it was): the positions, less what the batch consumed.
            starts = {(t, p): first for t, p, first, _ in batch}
            restored = {
                tp: starts.get(tp, end)
                for tp, end in transaction.positions.items()
                if tp[0] in self.model.restore_topics
            }
        for topic in self.model.restore_topics:
            for tp in self._index.of_topic(topic):
                for record in self._index.range(tp, 0, restored.get(tp, 0)):
                    if not self.model.restores(kind_of(record.type)):
                        continue
                    envelope = decoded(record)
                    if envelope is not None:
                        self.model.restore(self._state, envelope)
                        self._fed += 1
                # What the restore folded, the consumer reads again only in the batches that had outputs.
                self._consumed[tp] = restored.get(tp, 0)
        # The other inputs go on from the committed offsets the run resumed at; where those are not
        # recorded, from where the replay of the runs before got to (what a run consumed after its last
        # outputs, before it stopped, is then handled quietly by the new run).
        for tp, offset in (transaction.resumed or {}).items():
            if tp[0] not in self.model.restore_topics:
                self._consumed[tp] = offset

    def _between(self, transaction: Transaction, batch: list[BatchRange]) -> list[Envelope]:
        """The records handled since the last transaction (batches with no outputs), quietly."""
        starts = {(t, p): first for t, p, first, _ in batch}
        ranges: list[list[LogRecord]] = []
        for tp in sorted(self._index.partitions):
            if tp[0] not in self.model.live_topics:
                continue
            start = self._consumed.get(tp, 0)
            end = starts.get(tp, transaction.positions.get(tp, start))
            if end > start:
                ranges.append(self._index.range(tp, start, end))
                self._consumed[tp] = end
        outputs: list[Envelope] = []
        for record in self._index.merged(ranges):
            envelope = self._select(record)
            if isinstance(envelope, DeadLetter):
                outputs += [e for _, e in self.model.unreadable(self._state, envelope, [])]
            elif envelope is not None:
                where = fingerprint(envelope, record.topic, record.partition, record.offset)
                outputs += self._handle(envelope, where, [])
        return outputs


# -- the command line ------------------------------------------------------------------------------


class ReplayLog(Protocol):
    """A service's replay of a whole log, with the settings it reads from the environment."""

    def __call__(self, records: Sequence[LogRecord], *, prefix: str, gated: bool) -> ReplayReport: ...


class Decider(Protocol):
    """A service's replay module (what `gangline replay --decider` loads)."""

    def decider_topics(self, prefix: str) -> list[str]: ...

    def replay_log(self, records: Sequence[LogRecord], *, prefix: str, gated: bool) -> ReplayReport: ...


SERVICES: dict[str, str] = {
    "admission": "services.admission.replay",
    "quota": "services.quota.replay",
    "placement": "services.placement.replay",
    "preemption": "services.preemption.replay",
    "node_health": "services.node_health.replay",
}
"""Every decision service with a replay, in pipeline order → its module (imported when used)."""

SOURCES: dict[str, str] = {
    "admission": "gangline/admission",
    "quota": "gangline/quota",
    "placement": "gangline/placement",
    "preemption": "gangline/preemption",
    "node_health": "gangline/node-health",
}
"""Each service's envelope ``source``: whether it is present in a log is told by its outputs."""


def load(service: str) -> Decider:
    return cast(Decider, importlib.import_module(SERVICES[service]))


def report(result: ReplayReport, max_problems: int) -> None:
    print(result.summary())
    for d in result.differences[:max_problems]:
        print(f"  difference: {d.message}")


def decider_topics(prefix: str) -> list[str]:
    """`--decider all`: every topic some service's replay reads under ``prefix``: the public topics and
    quota's ticks (a status a tick made due is re-decided from the tick; without it, not at all)."""
    topics = TopicNames(prefix=prefix)
    return [
        topics.requests,
        topics.events,
        topics.allocations,
        topics.inventory,
        topics.heartbeats,
        topics.health,
        topics.operator,
        topics.queue_status,
        topics.quota_ticks,
    ]


def present(records: Iterable[LogRecord]) -> list[str]:
    """The services whose outputs are in the log, in pipeline order."""
    sources = {r.envelope.get("source") for r in records}
    return [service for service, source in SOURCES.items() if source in sources]


def verify_decisions(records: Sequence[LogRecord], *, prefix: str, gated: bool, max_problems: int) -> bool:
    """`gangline replay --verify --decider all`: each service in the log replayed; True if identical."""
    services = present(records)
    if not services:
        print("no decision service's outputs in the log: nothing to replay")
        return True
    same = True
    totals = [0, 0, 0]
    for service in services:
        result = load(service).replay_log(records, prefix=prefix, gated=gated)
        report(result, max_problems)
        same = same and result.ok
        totals = [
            totals[0] + result.transactions,
            totals[1] + result.compared,
            totals[2] + len(result.differences),
        ]
    absent = [s for s in SERVICES if s not in services]
    print(
        f"all services: {len(services)} replayed ({', '.join(services)}), {totals[0]} transactions, "
        f"{totals[1]} outputs compared: {'identical' if same else f'{totals[2]} difference(s)'}"
        + (f"; not in the log: {', '.join(absent)}" if absent else "")
    )
    return same


def verify_with(
    replay_log: ReplayLog, records: Sequence[LogRecord], *, prefix: str, gated: bool, max_problems: int
) -> bool:
    """`gangline replay --verify --decider NAME`: replay, print the report; True if identical."""
    result = replay_log(records, prefix=prefix, gated=gated)
    report(result, max_problems)
    return result.ok


def main(
    argv: Sequence[str] | None = None,
    *,
    prog: str,
    topics: Callable[[str], list[str]] = decider_topics,
    replay_log: ReplayLog | None = None,
) -> int:
    """``python -m services.<name>.replay`` (every service when ``replay_log`` is None).

    0: identical; 1: an output differs; 2: unusable input.
    """
    p = argparse.ArgumentParser(prog=prog, description="re-run the decisions from the recorded log")
    p.add_argument(
        "--from", dest="source", required=True, help="a JSONL file from `gangline export`, or kafka"
    )
    p.add_argument("--bootstrap", help="with --from kafka: host:port")
    p.add_argument("--prefix", default="", help="the topic name prefix the services ran with")
    p.add_argument("--ungated", action="store_true", help="placement (and preemption's mirror) ran ungated")
    p.add_argument("--max-problems", type=int, default=20)
    args = p.parse_args(argv)
    source: LogSource
    if args.source == "kafka":
        from gangline.replay.kafka import KafkaSource

        source = KafkaSource(args.bootstrap)
    else:
        source = FileSource(args.source)
    try:
        records = source.records(topics(args.prefix) if args.source == "kafka" else None)
    except (OSError, LogFormatError, LookupError, TimeoutError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    options: dict[str, Any] = {
        "prefix": args.prefix,
        "gated": not args.ungated,
        "max_problems": args.max_problems,
    }
    if replay_log is None:
        ok = verify_decisions(records, **options)
    else:
        ok = verify_with(replay_log, records, **options)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(prog="python -m services.common.replay"))


# -- pools -------------------------------------------------------------------------------------------


def pool_records(records: Sequence[LogRecord], topics: TopicNames, partition: int) -> list[LogRecord]:
    """What one pool's owner reads and writes: its partition of each pooled topic, all of the others."""
    pooled = frozenset(topics.pooled())
    return [r for r in records if r.topic not in pooled or r.partition == partition]


def per_pool(
    records: Sequence[LogRecord],
    topics: TopicNames,
    layout: PoolLayout,
    replay: Callable[[Sequence[LogRecord]], ReplayReport],
) -> ReplayReport:
    """A pool-owned service's replay (gangline.core.pools): each pool on its own, over its partitions
    (:func:`pool_records`), as its owners decided it (each owner's run an incarnation of the pool's); the
    report sums them."""
    reports = [replay(pool_records(records, topics, layout.partition(pool))) for pool in layout.pools]
    return ReplayReport(
        service=reports[0].service,
        transactions=sum(r.transactions for r in reports),
        incarnations=sum(r.incarnations for r in reports),
        inputs=sum(r.inputs for r in reports),
        compared=sum(r.compared for r in reports),
        differences=[d for r in reports for d in r.differences],
        unverified=sum(r.unverified for r in reports),
    )
