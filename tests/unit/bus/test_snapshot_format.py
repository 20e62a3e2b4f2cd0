"""The snapshot record format: chunks and a manifest, read back whole, or refused with the reason."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import pytest

import gangline.bus.snapshots as snapshots
from gangline.bus.snapshots import (
    MANIFEST_KEY,
    SnapshotUnreadable,
    assemble,
    parse_manifest,
    snapshot_records,
)

WHEN = datetime(2026, 1, 1, tzinfo=UTC)
HEADS = {("allocations.log", 2, "gangline/placement"): (41, "ab" * 32)}


def records(payload: bytes) -> list[snapshots.SnapshotRecord]:
    return snapshot_records(
        payload,
        snapshot_id="s1",
        kind="placement/1",
        config={"gated": True},
        positions={("jobs.events", 0): 12, ("allocations.log", 2): 7},
        written_at=WHEN,
        events=99,
        chain_heads=HEADS,
    )


def test_a_large_state_is_cut_into_chunks_under_the_limit_and_put_back_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(snapshots, "CHUNK_BYTES", 1000)
    payload = os.urandom(5000)  # does not compress: five chunks and a bit
    written = records(payload)
    *chunks, manifest_record = written
    assert manifest_record.key == MANIFEST_KEY and len(chunks) == 6
    assert all(len(c.value) <= 1000 for c in chunks)
    assert {h for c in written for h in c.headers} == {(snapshots.SNAPSHOT_HEADER, b"s1")}
    manifest = parse_manifest(manifest_record.value)
    assert manifest.positions == {("jobs.events", 0): 12, ("allocations.log", 2): 7}
    assert (manifest.kind, manifest.config, manifest.events, manifest.chunks) == (
        "placement/1",
        {"gated": True},
        99,
        6,
    )
    assert manifest.chain_heads == HEADS
    assert assemble(manifest, [c.value for c in chunks]) == payload


def test_a_missing_or_corrupt_chunk_is_refused() -> None:
    manifest_record = records(b"state " * 1000)[-1]
    manifest = parse_manifest(manifest_record.value)
    with pytest.raises(SnapshotUnreadable, match="chunks found"):
        assemble(manifest, [])
    with pytest.raises(SnapshotUnreadable, match="decompress"):
        assemble(manifest, [b"garbage"])
    other = records(b"other " * 1000)[0].value
    with pytest.raises(SnapshotUnreadable, match="size and hash"):
        assemble(manifest, [other])


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"format": 2}, "snapshot format 2"),
        ({"compression": "lz4"}, "unknown compression"),
        ({"chunks": "many"}, "garbles a field"),
        ({"positions": "jobs.events:x:1"}, "garbles a field"),
    ],
)
def test_a_manifest_of_another_format_or_garbled_is_unreadable(
    change: dict[str, object], reason: str
) -> None:
    manifest = json.loads(records(b"x")[-1].value)
    with pytest.raises(SnapshotUnreadable, match=reason):
        parse_manifest(json.dumps({**manifest, **change}).encode())
    with pytest.raises(SnapshotUnreadable, match="not JSON"):
        parse_manifest(b"\xff")
