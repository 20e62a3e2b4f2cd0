"""State snapshots on a compacted topic: the record format, and reading the latest one back.

A decision service whose state is a fold of the log writes that state, every so often, to its own
compacted snapshot topic (``<service>.snapshots``, one partition) in the same transaction as a batch's
outputs (:class:`~gangline.bus.processor.Processor`'s ``snapshots``). A restart loads the latest
snapshot and reads only the log after the positions it covers.

One snapshot is a few records, all in one transaction, in this order:

* ``chunk-00000`` … ``chunk-<n-1>``: the payload (the service's encoding of its state), compressed
  with zlib (level 1: fast, and a fold of ids shrinks five- to tenfold) and cut into pieces of at most
  :data:`CHUNK_BYTES`, well under the broker's default ``message.max.bytes`` (1 MiB), so any size fits;
* ``manifest``: JSON with the format version (:data:`FORMAT_VERSION`), the snapshot's id, what it holds
  (``kind``: the service and its state layout version, and ``config``: the settings the fold depends
  on), the input positions it covers (``topic:partition:next_offset``, as :mod:`gangline.bus.positions`
  writes them), the number of chunks, the payload's size and SHA-256, and when it was written.

Compaction keeps the latest record per key, so the latest snapshot always survives whole; chunks of an
older, larger snapshot may linger under higher keys, and name another id. The latest snapshot is found
from the end of the topic (:func:`read_latest`): its manifest is the last committed record, and its
chunks are the ``n`` records right before it (one producer wrote them in one transaction).

Anything that does not read as such (an unknown format version, a missing or corrupt chunk) raises
:class:`SnapshotUnreadable` with the reason: the caller rebuilds from the whole log instead.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition

from gangline.bus.chain import ChainKey
from gangline.bus.positions import Partition, format_positions, parse_positions
from gangline.bus.security import KafkaSecurity, client_options

FORMAT_VERSION = 1
"""The record format above; a manifest naming another is unreadable (a full rebuild follows)."""
MANIFEST_KEY = b"manifest"
CHUNK_BYTES = 768 * 1024
"""The most payload bytes per chunk record: with the record's overhead, under the broker's 1 MiB."""
COMPRESSION = "zlib"
FETCH_WAIT_MS = 20
"""A fetch's long poll: short, since what is read is there (a long one holds up the offset requests
queued behind it on the connection, half a second each at the broker's default)."""
SNAPSHOT_HEADER = "gangline-snapshot"
"""Every record of a snapshot carries its id (chunks are matched to their manifest by it)."""


class SnapshotUnreadable(Exception):
    """The latest snapshot cannot be used; the message says why (rebuild from the log instead)."""


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """One record of a snapshot, to send to the snapshot topic (partition 0)."""

    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Manifest:
    snapshot_id: str
    kind: str
    """The service and its state layout, e.g. ``placement/1``: another layout is not loaded."""
    config: Mapping[str, Any]
    """The settings the fold depends on when the snapshot was written: other settings, no load."""
    positions: Mapping[Partition, int]
    chunks: int
    size: int
    sha256: str
    written_at: str
    events: int
    """Events folded into the state, the restore included, over the run that wrote it (a figure)."""
    chain_heads: Mapping[ChainKey, tuple[int, str]] = field(default_factory=dict)
    """The hash chains' heads (:mod:`gangline.bus.chain`) with the snapshot's outputs: a restart goes on
    from them, reading the chained topics from ``positions``, not from their beginning."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The latest snapshot read back: its manifest and its payload (decompressed, checked)."""

    manifest: Manifest
    payload: bytes
    offset: int
    """The manifest's offset on the snapshot topic."""
    log_starts: Mapping[Partition, int]
    log_ends: Mapping[Partition, int]
    """Where the logs of the ``bounds_of`` topics began and ended when the snapshot was read."""

    def out_of_bounds(self) -> str | None:
        """Why the log cannot continue this snapshot, or None: a position past the end of its log (the
        topic was recreated), or before its start (the records after the snapshot were deleted)."""
        for tp, offset in sorted(self.manifest.positions.items()):
            end = self.log_ends.get(tp)
            if end is not None and offset > end:
                return f"it covers {tp[0]}[{tp[1]}] up to {offset}, past the log's end {end}"
            start = self.log_starts.get(tp)
            if start is not None and offset < start:
                return f"{tp[0]}[{tp[1]}] lost the records from {offset} to {start} (retention)"
        return None


def chunk_key(index: int) -> bytes:
    return f"chunk-{index:05d}".encode()


def snapshot_records(
    payload: bytes,
    *,
    snapshot_id: str,
    kind: str,
    config: Mapping[str, Any],
    positions: Mapping[Partition, int],
    written_at: datetime,
    events: int = 0,
    chain_heads: Mapping[ChainKey, tuple[int, str]] | None = None,
) -> list[SnapshotRecord]:
    """The chunks of ``payload`` (compressed) and the manifest after them (see the module docstring)."""
    packed = zlib.compress(payload, 1)
    pieces = [packed[i : i + CHUNK_BYTES] for i in range(0, len(packed), CHUNK_BYTES)] or [b""]
    headers = ((SNAPSHOT_HEADER, snapshot_id.encode()),)
    records = [SnapshotRecord(chunk_key(i), piece, headers) for i, piece in enumerate(pieces)]
    manifest = {
        "format": FORMAT_VERSION,
        "id": snapshot_id,
        "kind": kind,
        "config": dict(config),
        "positions": format_positions(positions),
        "chunks": len(pieces),
        "compression": COMPRESSION,
        "size": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "written_at": written_at.isoformat(),
        "events": events,
        "chain": sorted(
            [t, p, source, seq, prev] for (t, p, source), (seq, prev) in (chain_heads or {}).items()
        ),
    }
    value = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    records.append(SnapshotRecord(MANIFEST_KEY, value, headers))
    return records


def parse_manifest(value: bytes | None) -> Manifest:
    """The manifest in ``value``; :class:`SnapshotUnreadable` when it is not one this code can read."""
    try:
        raw = json.loads(value or b"")
    except (ValueError, UnicodeDecodeError) as error:
        raise SnapshotUnreadable(f"the manifest is not JSON: {error}") from error
    if not isinstance(raw, dict):
        raise SnapshotUnreadable("the manifest is not a JSON object")
    if raw.get("format") != FORMAT_VERSION:
        raise SnapshotUnreadable(
            f"snapshot format {raw.get('format')!r}; this version reads format {FORMAT_VERSION}"
        )
    if raw.get("compression") != COMPRESSION:
        raise SnapshotUnreadable(f"unknown compression {raw.get('compression')!r}")
    try:
        chunks = int(raw["chunks"])
        if chunks < 1:
            raise ValueError("no chunks")
        return Manifest(
            snapshot_id=str(raw["id"]),
            kind=str(raw["kind"]),
            config=dict(raw.get("config") or {}),
            positions=parse_positions(str(raw["positions"])),
            chunks=chunks,
            size=int(raw["size"]),
            sha256=str(raw["sha256"]),
            written_at=str(raw.get("written_at", "")),
            events=int(raw.get("events", 0)),
            chain_heads={
                (str(t), int(p), str(source)): (int(seq), str(prev))
                for t, p, source, seq, prev in raw.get("chain") or ()
            },
        )
    except (KeyError, TypeError, ValueError) as error:
        raise SnapshotUnreadable(f"the manifest lacks or garbles a field: {error!r}") from error


def assemble(manifest: Manifest, chunks: Sequence[bytes]) -> bytes:
    """The payload of ``manifest`` from its chunks, decompressed and checked against size and hash."""
    if len(chunks) != manifest.chunks:
        raise SnapshotUnreadable(f"{len(chunks)} chunks found of {manifest.chunks}")
    try:
        payload = zlib.decompress(b"".join(chunks))
    except zlib.error as error:
        raise SnapshotUnreadable(f"the payload does not decompress: {error}") from error
    if len(payload) != manifest.size or hashlib.sha256(payload).hexdigest() != manifest.sha256:
        raise SnapshotUnreadable("the payload does not match the manifest's size and hash")
    return payload


async def read_latest(
    bootstrap: str,
    topic: str,
    *,
    bounds_of: Sequence[str] = (),
    security: KafkaSecurity | None = None,
    request_timeout_ms: int = 30_000,
    partition: int = 0,
) -> Snapshot | None:
    """The latest committed snapshot on ``topic`` (``partition``: 0, or a pool's), with the bounds of the
    logs of the ``bounds_of`` topics (:meth:`Snapshot.out_of_bounds`); None when there is none.

    Raises :class:`SnapshotUnreadable` when the latest manifest or its chunks cannot be used, and
    ``RuntimeError`` when the topic does not exist.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        **client_options(security),
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        request_timeout_ms=request_timeout_ms,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_wait_ms=FETCH_WAIT_MS,
    )
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        if not consumer.partitions_for_topic(topic):
            raise RuntimeError(f"snapshot topic missing on the broker: {topic}")
        if partition not in consumer.partitions_for_topic(topic):
            raise RuntimeError(f"snapshot topic {topic} has no partition {partition}")
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        start = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        window = 16
        while True:
            first = max(start, end - window)
            manifest_at = await _last_manifest(consumer, tp, first, end)
            if manifest_at is not None:
                offset, value = manifest_at
                manifest = parse_manifest(value)
                payload = await _payload(consumer, tp, offset, manifest)
                starts, ends = await _bounds(consumer, bounds_of)
                return Snapshot(manifest, payload, offset, starts, ends)
            if first <= start:
                return None
            window *= 4
    finally:
        await consumer.stop()


async def _bounds(
    consumer: AIOKafkaConsumer, topics: Sequence[str]
) -> tuple[dict[Partition, int], dict[Partition, int]]:
    tps = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
    if not tps:
        return {}, {}
    starts = await consumer.beginning_offsets(tps)
    ends = await consumer.end_offsets(tps)
    return (
        {(tp.topic, tp.partition): offset for tp, offset in starts.items()},
        {(tp.topic, tp.partition): offset for tp, offset in ends.items()},
    )


async def _read(consumer: AIOKafkaConsumer, tp: TopicPartition, first: int, end: int) -> list[Any]:
    """The committed records of ``tp`` from ``first`` up to ``end`` (aborted ones and markers skipped)."""
    consumer.seek(tp, first)
    records: list[Any] = []
    while await consumer.position(tp) < end:
        batch = await consumer.getmany(tp, timeout_ms=500)
        records += [r for r in batch.get(tp, []) if r.offset < end]
    return records


async def _last_manifest(
    consumer: AIOKafkaConsumer, tp: TopicPartition, first: int, end: int
) -> tuple[int, bytes | None] | None:
    manifests = [r for r in await _read(consumer, tp, first, end) if r.key == MANIFEST_KEY]
    if not manifests:
        return None
    last = manifests[-1]
    return int(last.offset), last.value


async def _payload(consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int, manifest: Manifest) -> bytes:
    records = await _read(consumer, tp, max(0, offset - manifest.chunks), offset)
    wanted = manifest.snapshot_id.encode()
    chunks: dict[bytes, bytes] = {}
    for record in records:
        ids = [value for name, value in record.headers or () if name == SNAPSHOT_HEADER]
        if ids == [wanted] and record.key is not None and record.key != MANIFEST_KEY:
            chunks[record.key] = record.value or b""
    keys = [chunk_key(i) for i in range(manifest.chunks)]
    missing = [k.decode() for k in keys if k not in chunks]
    if missing:
        raise SnapshotUnreadable(
            f"snapshot {manifest.snapshot_id} lacks {len(missing)} chunks: {missing[:3]}"
        )
    return assemble(manifest, [chunks[k] for k in keys])


class SnapshotWriter(Protocol):
    """What a :class:`~gangline.bus.processor.Processor` asks in each batch's transaction.

    ``records`` is called once per attempt of a batch, after its events were handled (a retried batch
    asks again); ``committed`` once the batch's transaction committed, saying whether its records
    went with it. ``events``: the records the batch consumed.
    """

    topic: str
    partition: int
    """The snapshot topic's partition the snapshots go to (0; a pool's index with pools)."""

    def due(self, events: int) -> bool:
        """Whether this batch (``events`` records) is to carry a snapshot."""
        ...

    def records(
        self, positions: Mapping[Partition, int], events: int, chain_heads: Mapping[ChainKey, tuple[int, str]]
    ) -> Sequence[SnapshotRecord]:
        """A snapshot of the state as it stands (covering ``positions``; the hash chains' heads with this
        batch's outputs) when one is due, else none."""
        ...

    def committed(self, written: bool, events: int) -> None:
        """The batch's transaction committed; ``written``: with the records ``records`` gave."""
        ...

    def aborted(self, error: Exception) -> None:
        """A transaction that carried a snapshot aborted (the batch is tried again): the writer should
        let the retry go without one, so a snapshot the broker refuses never holds the outputs back."""
        ...
