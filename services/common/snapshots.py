"""A decision service's state on its snapshot topic: written with its outputs, loaded at start.

The state of a single-leader service is a fold of the topics it restores from
(:mod:`services.common.shell`). Every ``every_events`` events consumed, or ``every_s`` seconds when any
came, the processor adds a snapshot of it to the batch's transaction (:class:`StateSnapshots`, the bus's
:class:`~gangline.bus.snapshots.SnapshotWriter`), covering the input positions of that batch; never so
often that taking them uses more than ``max_share`` of the time (a big state is saved less often). A
start loads the latest snapshot (:meth:`StateSnapshots.load`) and reads only the log after those
positions.

What is saved is what a restore from the log rebuilds, and nothing else: the state's ``SNAPSHOT_FIELDS``
(a class attribute naming the fields the fold fills). What the running service keeps besides (what it
last told each waiting job, cycle numbers, caches) starts afresh at a start, as it does after a restore
from the log, and settings come from the settings: so a state loaded from a snapshot and read up to the
end of the log is the state a restore from the whole log builds, and decides the same
(tests/unit/services/test_placement_snapshots.py). The replay verification ignores snapshots: it
rebuilds each run's state from the whole log, which the topics' retention keeps.

The payload is the saved fields pickled (it keeps the objects' sharing: one job record in two tables),
read back with an unpickler that builds only classes of the project (``gangline.*``, ``services.*``) and
a few plain types: the topic is the service's own, which only its principal may write
(deploy/kafka/access.yaml), and a forged record still runs no code. The manifest names the service
and ``SNAPSHOT_VERSION`` (the layout of the saved fields) and the settings the fold depends on
(``config``); a snapshot of another layout, of other settings, of another format, or that does not read,
is not loaded: the state is rebuilt from the whole log, with a log line saying why.
"""

from __future__ import annotations

import io
import logging
import pickle
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, Protocol

from aiokafka.errors import KafkaError
from pydantic import BaseModel, ConfigDict, Field

from gangline.bus.chain import ChainKey
from gangline.bus.positions import Partition
from gangline.bus.processor import ChainResume
from gangline.bus.security import KafkaSecurity
from gangline.bus.snapshots import SnapshotRecord, SnapshotUnreadable, read_latest, snapshot_records

log = logging.getLogger(__name__)

DEFAULT_EVERY_EVENTS = 10_000
"""At most this many events after the snapshot a restart loads (about 0.3 s of restore)."""
DEFAULT_EVERY_S = 60.0
MAX_ABORTS = 3
"""Transactions aborted with a snapshot in them, none committed in between, before snapshots stop."""
DEFAULT_MAX_SHARE = 0.05
"""At most this share of the time goes to taking snapshots: a state that takes 1 s to save is saved at
most every 20 s, however many events come (the tail a restart reads grows instead)."""


class Snapshotted(Protocol):
    SNAPSHOT_FIELDS: ClassVar[tuple[str, ...]]
    """The fields a restore from the log fills: what a snapshot saves and loads (``part.field`` for a
    field of a part of the state)."""
    SNAPSHOT_VERSION: ClassVar[int]
    """The layout of those fields; bumped when their meaning changes (older snapshots are not loaded)."""


_PLAIN = {
    "builtins": frozenset(
        {"set", "frozenset", "dict", "list", "tuple", "str", "bytes", "int", "float", "bool", "complex"}
    ),
    "datetime": frozenset({"datetime", "date", "time", "timedelta", "timezone"}),
    "collections": frozenset({"OrderedDict", "deque", "defaultdict", "Counter"}),
}
_PROJECT = ("gangline.", "services.")


class _StateUnpickler(pickle.Unpickler):
    """Builds only the project's own classes and a few plain types; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _PLAIN.get(module, ()):
            return super().find_class(module, name)
        if module.startswith(_PROJECT) and "." not in name and not name.startswith("__"):
            found = super().find_class(module, name)
            if isinstance(found, type) and found.__module__ == module:
                return found
        raise pickle.UnpicklingError(f"a snapshot may not build {module}.{name}")


def _field(state: object, path: str) -> Any:
    """``state.a.b`` for the path ``a.b`` (a field of a part of the state)."""
    for name in path.split("."):
        state = getattr(state, name)
    return state


def _set_field(state: object, path: str, value: Any) -> None:
    *parents, name = path.split(".")
    setattr(_field(state, ".".join(parents)) if parents else state, name, value)


class FrozenPart:
    """A frozen model pickled on its own (:class:`FrozenParts`): unpickling it builds the model."""

    def __new__(cls, payload: bytes) -> Any:
        return _StateUnpickler(io.BytesIO(payload)).load()


class FrozenParts:
    """The pickled bytes of a state's frozen models (node registrations, job specs, grants), kept from one
    snapshot to the next: they never change, so a snapshot copies their bytes instead of pickling each
    model again (the models were most of a snapshot's time: 1,000 registrations of 8 GPUs each, 0.7 of
    0.95 s on a busy machine). Only what the last snapshot held is kept."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[object, bytes]] = {}

    def _bytes_of(self, model: BaseModel, used: dict[int, tuple[object, bytes]]) -> bytes:
        entry = self._kept.get(id(model))
        if entry is None or entry[0] is not model:  # the same id may be a new object's
            entry = (model, pickle.dumps(model, protocol=5))
        used[id(model)] = entry
        return entry[1]


class _PartsPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, parts: FrozenParts) -> None:
        super().__init__(file, protocol=5)
        self._parts = parts
        self.used: dict[int, tuple[object, bytes]] = {}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, BaseModel) and obj.model_config.get("frozen"):
            return FrozenPart, (self._parts._bytes_of(obj, self.used),)
        return NotImplemented


def encode_state(state: Snapshotted, parts: FrozenParts | None = None) -> bytes:
    """The saved fields of ``state``, pickled; with ``parts``, its frozen models copied from the bytes the
    last snapshot pickled them to (those it no longer holds are forgotten)."""
    saved = {path: _field(state, path) for path in state.SNAPSHOT_FIELDS}
    if parts is None:
        return pickle.dumps(saved, protocol=5)
    out = io.BytesIO()
    pickler = _PartsPickler(out, parts)
    pickler.dump(saved)
    parts._kept = pickler.used
    return out.getvalue()


def load_state(state: Snapshotted, saved: Mapping[str, Any]) -> None:
    """Put the saved fields into ``state``; then its ``snapshot_loaded()``, if it has one, sets what a
    restore from the log would have left that the snapshot does not hold."""
    for path, value in saved.items():
        _set_field(state, path, value)
    loaded = getattr(state, "snapshot_loaded", None)
    if callable(loaded):
        loaded()


def decode_state(payload: bytes, fields: Sequence[str]) -> dict[str, Any]:
    """The saved fields from ``payload``; :class:`SnapshotUnreadable` unless it holds exactly ``fields``."""
    try:
        saved = _StateUnpickler(io.BytesIO(payload)).load()
    except Exception as error:  # a garbled pickle raises anything from EOFError to TypeError
        raise SnapshotUnreadable(f"the state does not unpickle: {type(error).__name__}: {error}") from error
    if not isinstance(saved, dict) or set(saved) != set(fields):
        got = sorted(saved) if isinstance(saved, dict) else type(saved).__name__
        raise SnapshotUnreadable(f"the state holds {got}, not the fields {sorted(fields)}")
    return saved


class StateSnapshots:
    """Writes ``state`` to ``topic`` in the processor's transactions, and loads it back at a start.

    ``restore_topics``: what the state is a fold of (the positions a snapshot covers are kept for those
    only); ``config``: the settings the fold depends on (a snapshot written under others is not loaded).
    """

    def __init__(
        self,
        state: Snapshotted,
        *,
        topic: str,
        service: str,
        restore_topics: Sequence[str],
        config: Mapping[str, Any] | None = None,
        every_events: int = DEFAULT_EVERY_EVENTS,
        every_s: float = DEFAULT_EVERY_S,
        max_share: float = DEFAULT_MAX_SHARE,
        clock: Callable[[], float] = time.monotonic,
        partition: int = 0,
    ) -> None:
        self.topic = topic
        self.partition = partition
        """The snapshot topic's partition: 0, or with pools the pool's (each pool's owner its own)."""
        self._state = state
        self._parts = FrozenParts()
        self._kind = f"{service}/{state.SNAPSHOT_VERSION}"
        self._restore_topics = frozenset(restore_topics)
        self._config = dict(config or {})
        self._every_events = every_events
        self._every_s = every_s
        self._clock = clock
        self._since_events = 0
        """Events folded since the snapshot the state was loaded from or last wrote (a restore's too)."""
        self._since = clock()
        self._max_share = max_share
        self._cost = 0.0
        """How long the last snapshot took to take (seconds)."""
        self._events_total = 0
        self.loaded: str | None = None
        """The id of the snapshot the state was loaded from at start, if any."""
        self.chain: ChainResume | None = None
        """Where the hash chains stood in that snapshot (the processor goes on from there)."""
        self.written = 0
        self.off = False
        """Set when the snapshot topic cannot be used (missing, not ours, refusing them): none is taken."""
        self._held = False
        """A transaction with a snapshot aborted: none until a batch commits without one."""
        self._aborts = 0

    # -- at start ----------------------------------------------------------------------------

    async def load(self, bootstrap: str, *, security: KafkaSecurity | None = None) -> dict[Partition, int]:
        """Load the latest snapshot into the state; the positions to read the log from (empty: from the
        start, when there is none or it cannot be used; why is logged)."""
        started = time.perf_counter()
        try:
            snapshot = await read_latest(
                bootstrap,
                self.topic,
                bounds_of=sorted(self._restore_topics),
                security=security,
                partition=self.partition,
            )
        except SnapshotUnreadable as error:
            log.warning("snapshot unreadable; rebuilding from the whole log: %s", error)
            return {}
        except (KafkaError, RuntimeError) as error:
            # No such topic, or this principal may not read it: it could not write it either.
            log.warning(
                "snapshot topic unusable; rebuilding from the whole log, and writing no snapshots: %r", error
            )
            self.off = True
            return {}
        if snapshot is None:
            log.info("no snapshot yet; rebuilding from the whole log", extra={"topic": self.topic})
            return {}
        manifest = snapshot.manifest
        why = self._unusable(manifest.kind, manifest.config, manifest.positions) or snapshot.out_of_bounds()
        if why is not None:
            log.warning("snapshot not used; rebuilding from the whole log: %s", why)
            return {}
        try:
            saved = decode_state(snapshot.payload, self._state.SNAPSHOT_FIELDS)
        except SnapshotUnreadable as error:
            log.warning("snapshot unreadable; rebuilding from the whole log: %s", error)
            return {}
        load_state(self._state, saved)
        self.loaded = manifest.snapshot_id
        self.chain = ChainResume(manifest.chain_heads, manifest.positions)
        self._events_total = manifest.events
        log.info(
            "state loaded from a snapshot",
            extra={
                "snapshot": manifest.snapshot_id,
                "written_at": manifest.written_at,
                "bytes": manifest.size,
                "chunks": manifest.chunks,
                "seconds": round(time.perf_counter() - started, 3),
            },
        )
        return dict(manifest.positions)

    def _unusable(
        self, kind: str, config: Mapping[str, Any], positions: Mapping[Partition, int]
    ) -> str | None:
        if kind != self._kind:
            return f"it holds {kind!r}; this version loads {self._kind!r}"
        if dict(config) != self._config:
            return f"written under other settings ({dict(config)}; now {self._config})"
        missing = sorted(self._restore_topics - {topic for topic, _ in positions})
        if missing:
            return f"it covers none of {missing}"
        return None

    def restored(self, events: int) -> None:
        """The restore folded ``events`` on top of what was loaded: they count towards the next snapshot."""
        self._since_events += events
        self._events_total += events

    # -- while processing (the bus's SnapshotWriter) -------------------------------------------

    def due(self, events: int) -> bool:
        since = self._since_events + events
        elapsed = self._clock() - self._since
        due = since >= self._every_events or (since > 0 and elapsed >= self._every_s)
        return not (self.off or self._held or not due or elapsed * self._max_share < self._cost)

    def records(
        self, positions: Mapping[Partition, int], events: int, chain_heads: Mapping[ChainKey, tuple[int, str]]
    ) -> Sequence[SnapshotRecord]:
        if not self.due(events):
            return []
        started = time.perf_counter()
        covered = {tp: offset for tp, offset in positions.items() if tp[0] in self._restore_topics}
        payload = encode_state(self._state, self._parts)
        records = snapshot_records(
            payload,
            snapshot_id=uuid.uuid4().hex,
            kind=self._kind,
            config=self._config,
            positions=covered,
            written_at=datetime.now(UTC),
            events=self._events_total + events,
            chain_heads=chain_heads,
        )
        self._cost = time.perf_counter() - started
        log.info(
            "snapshot taken",
            extra={
                "bytes": len(payload),
                "compressed": sum(len(r.value) for r in records[:-1]),
                "seconds": round(self._cost, 3),
                "chunks": len(records) - 1,
            },
        )
        return records

    def aborted(self, error: Exception) -> None:
        self._held = True
        self._aborts += 1
        if self._aborts >= MAX_ABORTS:
            self.off = True
            log.error("snapshots aborted %d transactions in a row; writing no more: %r", self._aborts, error)
        else:
            log.warning("a transaction with a snapshot aborted; the retry goes without: %r", error)

    def committed(self, written: bool, events: int) -> None:
        self._held = False
        if written:
            self._aborts = 0
        self._events_total += events
        if written:
            self._since_events = 0
            self._since = self._clock()
            self.written += 1
        else:
            self._since_events += events


class SnapshotSettings(BaseModel):
    """When a service snapshots its state (environment: GANGLINE_SNAPSHOT_*)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    snapshots: bool = True
    """GANGLINE_SNAPSHOTS: write snapshots and start from the latest (false: a start reads the whole log)."""
    snapshot_every_events: int = Field(default=DEFAULT_EVERY_EVENTS, ge=1)
    """A snapshot once this many events were consumed since the last one (a restart reads at most about
    this many events of the log, plus ``snapshot_every_s`` worth)."""
    snapshot_every_s: float = Field(default=DEFAULT_EVERY_S, gt=0)
    """A snapshot once this long has passed since the last one, when any event came meanwhile."""
    snapshot_max_share: float = Field(default=DEFAULT_MAX_SHARE, gt=0, le=1)
    """The most of the service's time taking snapshots may use (a big state is saved less often)."""

    def state_snapshots(
        self,
        state: Snapshotted,
        *,
        topic: str,
        service: str,
        restore_topics: Sequence[str],
        config: Mapping[str, Any] | None = None,
        partition: int = 0,
    ) -> StateSnapshots | None:
        """The snapshots of ``state`` under these settings (None when they are off); ``partition``: the
        snapshot topic's, a pool's with pools."""
        if not self.snapshots:
            return None
        return StateSnapshots(
            state,
            topic=topic,
            service=service,
            restore_topics=restore_topics,
            config=config,
            every_events=self.snapshot_every_events,
            every_s=self.snapshot_every_s,
            max_share=self.snapshot_max_share,
            partition=partition,
        )
