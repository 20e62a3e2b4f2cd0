"""The topic catalogue as read from YAML, and the admin helpers' behaviour without a broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from gangline.bus.admin import (
    CatalogueError,
    TopicSpec,
    load_catalogue,
    main,
    replication_for,
    wait_until_ready,
)

CATALOGUE = Path(__file__).resolve().parents[3] / "schemas" / "topics.yaml"
PUBLIC_TOPICS = {
    "jobs.requests",
    "jobs.events",
    "allocations.log",
    "nodes.inventory",
    "nodes.heartbeats",
    "nodes.health",
    "queues.status",
}


def test_the_committed_catalogue_has_every_public_topic_and_its_dead_letter_twin() -> None:
    specs = {s.name: s for s in load_catalogue(CATALOGUE)}
    assert specs.keys() >= PUBLIC_TOPICS
    for name in PUBLIC_TOPICS:
        dead_letter = specs[name].dead_letter
        assert dead_letter == f"{name}.dlq"
        assert specs[dead_letter].cleanup_policy == "delete"


def test_broker_configs_follow_the_spec() -> None:
    log = TopicSpec(name="a", key="job_id", partitions=3, retention_ms=1000)
    table = TopicSpec(name="b", key="node", partitions=1, cleanup_policy="compact")
    assert log.broker_configs() == {"cleanup.policy": "delete", "retention.ms": "1000"}
    assert table.broker_configs() == {"cleanup.policy": "compact"}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topics.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        (
            "topics:\n  - {name: a, key: k, partitions: 1}\n  - {name: a, key: k, partitions: 2}\n",
            "listed twice",
        ),
        ("topics:\n  - {name: a, key: k, partitions: 1, dead_letter: a.dlq}\n", "not in the catalogue"),
        ("topics:\n  - {name: a, key: k, partitions: 0}\n", "partitions"),
        ("topics:\n  - {name: a, key: k, partitions: 1, cleanup_policy: forever}\n", "cleanup_policy"),
        ("topics:\n  - {name: 'a b', key: k, partitions: 1}\n", "name"),
        ("topics: [\n", "topics.yaml"),
    ],
)
def test_a_bad_catalogue_is_refused_with_the_reason(tmp_path: Path, text: str, complaint: str) -> None:
    with pytest.raises(CatalogueError, match=complaint):
        load_catalogue(_write(tmp_path, text))


def test_a_missing_catalogue_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CatalogueError):
        load_catalogue(tmp_path / "nope.yaml")


def test_the_cli_reports_a_bad_catalogue_without_reaching_a_broker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "topics:\n  - {name: a, key: k, partitions: 0}\n")
    assert main(["create-topics", "--bootstrap", "127.0.0.1:9", "--catalogue", str(path)]) == 1
    assert "partitions" in capsys.readouterr().err


async def test_wait_until_ready_gives_up_where_nothing_listens() -> None:
    with pytest.raises(TimeoutError, match="not ready"):
        await wait_until_ready("127.0.0.1:9", timeout_s=0.5)


def test_replication_follows_the_cluster_size() -> None:
    # One copy on a laptop; three of which two must hold each write once there are three brokers.
    assert [replication_for(n) for n in (0, 1, 2, 3, 5)] == [(1, 1), (1, 1), (2, 1), (3, 2), (3, 2)]
