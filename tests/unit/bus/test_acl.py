"""The broker's ACLs as the project writes them from the catalogue and deploy/kafka/access.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from gangline.bus.acl import (
    AccessFile,
    AclBinding,
    Grant,
    Operation,
    PatternType,
    ResourceType,
    acl_bindings,
    load_access,
)
from gangline.bus.admin import CatalogueError, load_catalogue

ROOT = Path(__file__).resolve().parents[3]
SPECS = load_catalogue(ROOT / "schemas" / "topics.yaml")


def _topics(bindings: list[AclBinding], principal: str, operation: Operation) -> set[str]:
    return {
        b.resource_name
        for b in bindings
        if b.principal == f"User:{principal}"
        and b.operation is operation
        and b.resource_type is ResourceType.TOPIC
    }


def test_the_committed_access_file_gives_each_principal_only_its_part() -> None:
    bindings = acl_bindings(load_access(ROOT / "deploy" / "kafka" / "access.yaml"), SPECS, topic_prefix="p.")
    for producer in ("producer", "team-a", "team-b"):
        assert _topics(bindings, producer, Operation.WRITE) == {"p.jobs.requests"}
        assert _topics(bindings, producer, Operation.READ) == set()
    assert _topics(bindings, "api", Operation.WRITE) == {"p.jobs.requests", "p.nodes.operator"}
    # The dashboard's live feed reads what it shows, from the end, in no group; it dead-letters nothing.
    watched = ("jobs.events", "allocations.log", "nodes.inventory", "nodes.health", "nodes.operator")
    assert _topics(bindings, "api", Operation.READ) == {f"p.{t}" for t in (*watched, "queues.status")}
    # Operators' cordons and drains: the API (which lets only admin tokens ask) is their one writer.
    writers = {p for p in load_access(ROOT / "deploy" / "kafka" / "access.yaml").principals}
    assert {w for w in writers if "p.nodes.operator" in _topics(bindings, w, Operation.WRITE)} == {"api"}
    assert _topics(bindings, "agent", Operation.WRITE) == {
        "p.nodes.inventory",
        "p.nodes.heartbeats",
        "p.nodes.health",
        "p.jobs.events",
        "p.allocations.log.dlq",
        "p.jobs.events.dlq",
    }
    # Read-only on the log: analytics writes only its own faust topics (changelogs, repartition).
    assert _topics(bindings, "analytics", Operation.WRITE) == {"gangline.analytics-"}
    assert _topics(bindings, "analytics", Operation.READ) == {
        "p.allocations.log",
        "p.jobs.events",
        "p.nodes.inventory",
        "gangline.analytics-",
    }
    assert "p.allocations.log" in _topics(bindings, "placement", Operation.WRITE)
    assert "p.allocations.log" not in _topics(bindings, "admission", Operation.WRITE)
    placement_txn = {
        b.resource_name
        for b in bindings
        if b.resource_type is ResourceType.TRANSACTIONAL_ID and b.principal == "User:placement"
    }
    assert placement_txn == {"gangline.placement."}
    assert not any(
        b.resource_type is ResourceType.TRANSACTIONAL_ID for b in bindings if b.principal == "User:producer"
    )


def test_a_group_is_its_name_and_its_sub_groups_and_the_readers_get_the_dead_letter_twin() -> None:
    access = AccessFile(super_user="admin", principals={"s": Grant(read=("jobs.events",), groups=("s",))})
    bindings = acl_bindings(access, SPECS, group_prefix="g")
    assert AclBinding("User:s", ResourceType.GROUP, "g.s", PatternType.LITERAL, Operation.READ) in bindings
    assert AclBinding("User:s", ResourceType.GROUP, "g.s.", PatternType.PREFIXED, Operation.READ) in bindings
    assert _topics(bindings, "s", Operation.WRITE) == {"jobs.events.dlq"}


def test_a_pattern_that_names_no_topic_is_an_error() -> None:
    access = AccessFile(super_user="admin", principals={"s": Grant(write=("job.events",))})
    with pytest.raises(CatalogueError, match="names no topic"):
        acl_bindings(access, SPECS)


def test_a_stream_app_owns_the_topics_and_transactional_ids_named_after_its_application_id() -> None:
    access = AccessFile(
        super_user="admin",
        principals={"a": Grant(read=("allocations.log",), groups=("a",), streams=True, dead_letters=False)},
    )
    bindings = acl_bindings(access, SPECS, topic_prefix="p.", group_prefix="g")
    own = [b for b in bindings if b.resource_name == "g.a-"]
    assert {(b.resource_type, b.operation) for b in own} == {
        (ResourceType.TOPIC, Operation.CREATE),
        (ResourceType.TOPIC, Operation.READ),
        (ResourceType.TOPIC, Operation.WRITE),
        (ResourceType.TOPIC, Operation.DESCRIBE),
        (ResourceType.TRANSACTIONAL_ID, Operation.WRITE),
        (ResourceType.TRANSACTIONAL_ID, Operation.DESCRIBE),
    }
    assert all(b.pattern_type is PatternType.PREFIXED for b in own)
    assert _topics(bindings, "a", Operation.WRITE) == {"g.a-"}  # no dead-letter twin, no public topic


def test_a_services_snapshot_topic_is_read_and_written_by_that_service_alone() -> None:
    bindings = acl_bindings(load_access(ROOT / "deploy" / "kafka" / "access.yaml"), SPECS, topic_prefix="p.")
    snapshot_topics = [s.name for s in SPECS if s.name.endswith(".snapshots")]
    assert snapshot_topics == [
        "placement.snapshots",
        "preemption.snapshots",
        "quota.snapshots",
        "node_health.snapshots",
    ]
    for topic in snapshot_topics:
        service = topic.removesuffix(".snapshots")
        on_it = {(b.principal, b.operation) for b in bindings if b.resource_name == f"p.{topic}"}
        assert on_it == {(f"User:{service}", Operation.READ), (f"User:{service}", Operation.WRITE)}
