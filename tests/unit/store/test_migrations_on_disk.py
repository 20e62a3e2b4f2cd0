"""Migration discovery and the store helpers that need no database."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gangline.store.ledger import LedgerEntry
from gangline.store.migrate import MigrationError, discover
from gangline.store.pool import DEFAULT_DSN, dsn_from_env


def test_the_shipped_migrations_are_numbered_from_one_without_gaps() -> None:
    versions = [m.version for m in discover()]
    assert versions == list(range(1, len(versions) + 1))
    assert "CREATE TABLE events" in discover()[0].sql


def test_a_misnamed_migration_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "1_init.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="NNNN_lower_snake"):
        discover(tmp_path)


def test_two_migrations_with_one_version_are_refused(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0001_b.sql").write_text("SELECT 2;")
    with pytest.raises(MigrationError, match="share a version"):
        discover(tmp_path)


def test_migrations_are_ordered_by_version(tmp_path: Path) -> None:
    for name in ("0010_later.sql", "0002_sooner.sql"):
        (tmp_path / name).write_text("SELECT 1;")
    assert [(m.version, m.name) for m in discover(tmp_path)] == [(2, "sooner"), (10, "later")]


def test_the_dsn_comes_from_the_environment_or_defaults_to_the_local_cluster() -> None:
    assert dsn_from_env({}) == DEFAULT_DSN
    assert dsn_from_env({"GANGLINE_PG_DSN": ""}) == DEFAULT_DSN
    assert dsn_from_env({"GANGLINE_PG_DSN": "postgresql://x@h:1/d"}) == "postgresql://x@h:1/d"


def test_a_ledger_entry_reads_a_structured_cloudevent() -> None:
    envelope = {
        "specversion": "1.0",
        "id": "evt-1",
        "source": "gangline/placement",
        "type": "gangline.allocation.granted.v1",
        "time": "2026-01-02T03:04:05.5Z",
        "subject": "job-7",
        "causationid": "evt-0",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "data": {"job_id": "job-7", "allocation_id": "a-1", "placements": []},
    }
    entry = LedgerEntry.from_cloudevent(envelope, topic="allocations.log", partition=2, offset=9)
    assert entry == LedgerEntry(
        event_id="evt-1",
        type="gangline.allocation.granted.v1",
        source="gangline/placement",
        subject="job-7",
        time=datetime(2026, 1, 2, 3, 4, 5, 500000, tzinfo=UTC),
        data={"job_id": "job-7", "allocation_id": "a-1", "placements": []},
        causation_id="evt-0",
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        topic="allocations.log",
        partition=2,
        offset=9,
    )
