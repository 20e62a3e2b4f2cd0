"""The reader's check of who wrote a record and whether that writer may say it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gangline.bus.trust import TrustPolicy, WriterSigner, derive_key, load_policy
from gangline.events.codec import decode

ROOT = Path(__file__).resolve().parents[3]
MASTER = b"unit-test-master-key"


def _policy(tmp_path: Path) -> TrustPolicy:
    key = tmp_path / "master"
    key.write_bytes(MASTER)
    return load_policy(
        ROOT / "deploy" / "kafka" / "access.yaml", key, ROOT / "deploy" / "docker" / "api-tokens.dev.yaml"
    )


def _record(kind: str, subject: str, data: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "specversion": "1.0",
            "id": "e1",
            "source": "test",
            "type": f"gangline.{kind}.v1",
            "time": "2026-01-01T00:00:00Z",
            "subject": subject,
            "datacontenttype": "application/json",
            "data": data,
        }
    ).encode()


def _check(policy: TrustPolicy, topic: str, value: bytes, signer: WriterSigner | None) -> str | None:
    headers = signer.headers(topic, b"k", value) if signer else []
    return policy.check(topic, b"k", value, headers, decode(value))


def _as(name: str, master: bytes = MASTER) -> WriterSigner:
    return WriterSigner(name, derive_key(master, name))


REQUEST = {"job_id": "j", "queue": "team-b", "workers": 1, "gpus_per_worker": 1}


def test_a_tenant_submits_only_to_its_own_queues_and_default(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    own = _record("job.requested", "j", REQUEST)
    assert _check(policy, "x.jobs.requests", own, _as("team-b")) is None
    assert (
        _check(
            policy,
            "x.jobs.requests",
            _record("job.requested", "j", {**REQUEST, "queue": "default"}),
            _as("team-a"),
        )
        is None
    )
    assert _check(policy, "x.jobs.requests", own, _as("team-a")) == "team-a may not submit to queue 'team-b'"
    assert (
        _check(policy, "jobs.requests", own, _as("producer")) == "producer may not submit to queue 'team-b'"
    )
    assert _check(policy, "jobs.requests", own, _as("api")) is None


def test_unsigned_or_wrongly_signed_records_are_refused(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    value = _record("job.requested", "j", REQUEST)
    assert _check(policy, "jobs.requests", value, None) == "the record carries no writer signature"
    bad = _check(policy, "jobs.requests", value, _as("team-b", master=b"guessed"))
    assert bad == "the signature of writer 'team-b' does not match the record"
    signed = _as("team-b").headers("jobs.requests", b"k", value)
    moved = policy.check("jobs.events", b"k", value, signed, decode(value))
    assert moved == "the signature of writer 'team-b' does not match the record"
    assert (
        _check(policy, "jobs.requests", value, _as("mallory"))
        == "writer 'mallory' is no principal of the access file"
    )


def test_an_agent_reports_only_on_its_node_and_never_fails_one(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    failed = _record("node.failed", "n-0", {"node": "n-0", "code": "operator", "reason": "forged"})
    assert _check(policy, "nodes.health", failed, _as("agent-n-0")) == "agent-n-0 may not write node.failed"
    assert _check(policy, "nodes.health", failed, _as("node_health")) is None
    cause = {"kind": "xid", "message": "xid.13: graphics engine exception", "xid": 13}
    error = {"node": "n-1", "gpu": "gpu0", "state": "healthy", "cause": cause}
    report = _record("gpu.error_reported", "n-1", error)
    assert (
        _check(policy, "nodes.health", report, _as("agent-n-0"))
        == "agent-n-0 reports for node 'n-0' only, not 'n-1'"
    )


def test_topics_only_services_write_are_not_checked_here(tmp_path: Path) -> None:
    """The broker's ACLs alone decide who writes allocations.log and queues.status."""
    policy = _policy(tmp_path)
    released = _record(
        "allocation.released", "j", {"job_id": "j", "allocation_id": "a", "reason": "completed"}
    )
    assert _check(policy, "allocations.log", released, None) is None


def test_only_the_api_says_an_operators_cordon_on_nodes_operator(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    cordon = _record("node.cordoned", "n-0", {"node": "n-0", "mode": "drain", "drain_grace_s": 60})
    assert _check(policy, "x.nodes.operator", cordon, _as("api")) is None
    assert (
        _check(policy, "x.nodes.operator", cordon, _as("agent-n-0"))
        == "agent-n-0 may not write node.cordoned"
    )
    assert _check(policy, "x.nodes.operator", cordon, None) == "the record carries no writer signature"
    back = _record("node.uncordoned", "n-0", {"node": "n-0"})
    assert _check(policy, "x.nodes.operator", back, _as("team-a")) == "team-a may not write node.uncordoned"


def test_a_writer_whose_kafka_user_is_renamed_signs_as_its_access_file_principal(tmp_path: Path) -> None:
    # On Kubernetes node_health authenticates as the KafkaUser node-health (no `_` in object names).
    key = tmp_path / "master"
    key.write_bytes(MASTER)
    env = {"GANGLINE_KAFKA_USERNAME": "node-health", "GANGLINE_TRUST_KEY_FILE": str(key)}
    policy = _policy(tmp_path)
    data = {"node": "n-0", "code": "heartbeat_timeout", "reason": "No heartbeat for 10 s."}
    failed = _record("node.failed", "n-0", data)
    as_kafka_user = WriterSigner.from_env(env)
    assert as_kafka_user is not None and as_kafka_user.principal == "node-health"
    assert _check(policy, "nodes.health", failed, as_kafka_user) is not None  # no such principal

    signer = WriterSigner.from_env({**env, "GANGLINE_WRITER_PRINCIPAL": "node_health"})
    assert signer is not None and signer.principal == "node_health"
    assert _check(policy, "nodes.health", failed, signer) is None
