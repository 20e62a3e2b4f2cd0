"""The codec: deterministic bytes, and every way a message can be unreadable gives a typed, readable error."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from gangline.events import codec
from gangline.events.base import Envelope, make_envelope
from gangline.events.codec import (
    DecodeError,
    MalformedMessage,
    SchemaViolation,
    UnknownEventType,
    decode,
    encode,
)
from gangline.events.jobs import JobRejected, JobRequested, Topology
from gangline.events.nodes import NodeHeartbeat, NodeHeartbeatV1
from gangline.events.registry import Registry, default_registry

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)


def request(**overrides: Any) -> JobRequested:
    fields: dict[str, Any] = {"job_id": "j-1", "queue": "team-a", "workers": 2, "gpus_per_worker": 4}
    return JobRequested(**(fields | overrides))


def envelope(data: Any = None, **overrides: Any) -> Envelope:
    return make_envelope(data or request(), event_id="e-1", source="test", time=T0, **overrides)


def message(**data_overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(encode(envelope()))
    body["data"].update(data_overrides)
    return body


def raw(body: Any) -> bytes:
    return json.dumps(body).encode()


def test_encode_is_canonical_json_with_sorted_keys_and_no_spaces() -> None:
    out = encode(envelope(request(env={"B": "2", "A": "1"}), causationid="e-0"))
    body = json.loads(out)
    assert out == json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert body["type"] == "gangline.job.requested.v1"
    assert body["subject"] == "j-1"
    assert body["time"] == "2025-03-01T09:00:00Z"
    assert body["causationid"] == "e-0"
    assert "traceparent" not in body  # absent attributes are left out, never null


def test_equal_envelopes_encode_to_equal_bytes_whatever_the_input_order_or_zone() -> None:
    cet = timezone(timedelta(hours=1))
    a = envelope(request(env={"A": "1", "B": "2"}))
    b = make_envelope(
        request(env={"B": "2", "A": "1"}),
        event_id="e-1",
        source="test",
        time=datetime(2025, 3, 1, 10, 0, tzinfo=cet),
    )
    assert encode(a) == encode(b)


def test_decode_inverts_encode() -> None:
    env = envelope(
        request(topology=Topology(level="nvlink"), command=("python", "train.py"), priority=5),
        causationid="e-0",
        traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
    decoded = decode(encode(env))
    assert decoded == env
    assert isinstance(decoded.data, JobRequested)
    assert decoded.data.topology == Topology(level="nvlink", mode="required")


def test_naive_time_is_refused_when_making_an_envelope() -> None:
    with pytest.raises(ValueError, match="timezone"):
        make_envelope(request(), event_id="e-1", source="test", time=datetime(2025, 3, 1))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xff\xfe garbage", "not UTF-8"),
        (b"{not json", "not JSON"),
        (b"", "not JSON"),
        (b"[1, 2]", "JSON array, not a CloudEvents object"),
        (b'"job.requested"', "JSON string, not a CloudEvents object"),
        (b"null", "JSON null, not a CloudEvents object"),
    ],
)
def test_bytes_that_are_not_a_json_object_are_malformed(payload: bytes, reason: str) -> None:
    with pytest.raises(MalformedMessage, match=reason) as err:
        decode(payload)
    assert err.value.code == "malformed_message"
    assert err.value.event_id is None


@pytest.mark.parametrize("attribute", ["specversion", "id", "source", "type", "time", "subject", "data"])
def test_a_missing_cloudevents_attribute_is_named(attribute: str) -> None:
    body = message()
    del body[attribute]
    with pytest.raises(MalformedMessage, match=f"missing CloudEvents attribute\\(s\\): {attribute}$"):
        decode(raw(body))


def test_what_could_be_read_is_kept_on_the_error() -> None:
    body = message(workers=0)
    with pytest.raises(SchemaViolation) as err:
        decode(raw(body))
    assert (err.value.event_id, err.value.subject, err.value.event_type) == (
        "e-1",
        "j-1",
        "gangline.job.requested.v1",
    )


@pytest.mark.parametrize(
    ("attribute", "value", "reason"),
    [
        ("specversion", "0.3", 'specversion must be "1.0" \\(got "0.3"\\)'),
        ("id", "", "id must be a non-empty string"),
        ("source", 7, "source must be a non-empty string \\(got 7\\)"),
        ("data", [1], "data must be a JSON object \\(got JSON array\\)"),
        ("time", "yesterday", "malformed_message: time: "),
        ("time", "2025-03-01T09:00:00", "malformed_message: time: input should have timezone info"),
        (
            "datacontenttype",
            "text/plain",
            "malformed_message: datacontenttype: must be one of 'application/json'",
        ),
        ("traceparent", "nope", "malformed_message: traceparent: must match"),
        ("partitionkey", "x", "unknown attribute\\(s\\): partitionkey"),
    ],
)
def test_bad_cloudevents_attributes_are_malformed(attribute: str, value: Any, reason: str) -> None:
    body = message()
    body[attribute] = value
    with pytest.raises(MalformedMessage, match=reason):
        decode(raw(body))


@pytest.mark.parametrize(
    ("wire_type", "reason"),
    [
        ("gangline.job.teleported.v1", "'gangline.job.teleported.v1' is not known here$"),
        ("gangline.job.requested.v2", "is not known here; the latest known is v1"),
        ("gangline.job.requested.v0", "not a Gangline event type"),
        ("com.example.job.requested", "not a Gangline event type"),
    ],
)
def test_unknown_event_types_are_reported_as_such(wire_type: str, reason: str) -> None:
    body = message()
    body["type"] = wire_type
    with pytest.raises(UnknownEventType, match=reason) as err:
        decode(raw(body))
    assert err.value.code == "unknown_event_type"


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"workers": 0}, "data.workers: must be >= 1 (got 0)"),
        ({"workers": "3"}, 'data.workers: must be an integer (got "3")'),
        ({"workers": 2.5}, "data.workers: must be an integer (got 2.5)"),
        ({"job_id": ""}, 'data.job_id: must not be empty (got "")'),
        ({"job_id": "../etc/passwd"}, "data.job_id: must match ^[A-Za-z0-9][A-Za-z0-9._-]*$"),
        ({"gpus_per_worker": -1}, "data.gpus_per_worker: must be >= 0 (got -1)"),
        (
            {"topology": {"level": "rack"}},
            "data.topology.level: must be one of 'nvlink', 'node', 'leaf' or 'spine'",
        ),
        ({"command": ["a", 1]}, "data.command[1]: must be a string (got 1)"),
        ({"preemptible": "yes"}, 'data.preemptible: must be true or false (got "yes")'),
        ({"gpus": 8}, "data.gpus: is not a field of this event"),
        (
            {"gpus_per_worker": 0},
            "data: gpus_per_worker must be >= 1 unless mig_profile or gpu_fraction_milli is given (got 0)",
        ),
    ],
)
def test_schema_violations_name_the_field_and_the_rule(overrides: dict[str, Any], problem: str) -> None:
    with pytest.raises(SchemaViolation) as err:
        decode(raw(message(**overrides)))
    assert err.value.code == "schema_violation"
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems
    assert problem in err.value.reason


def test_a_missing_required_field_is_named() -> None:
    body = message()
    del body["data"]["queue"]
    with pytest.raises(SchemaViolation, match=r"^schema_violation: data\.queue: is required$"):
        decode(raw(body))


def test_every_problem_is_reported_not_just_the_first() -> None:
    with pytest.raises(SchemaViolation) as err:
        decode(raw(message(workers=0, queue="")))
    assert len(err.value.problems) == 2
    assert str(err.value).startswith("schema_violation: ")


def test_subject_must_be_the_data_subject() -> None:
    body = message()
    body["subject"] = "someone-else"
    with pytest.raises(SchemaViolation, match="subject: must equal the data's subject 'j-1'"):
        decode(raw(body))


def test_all_decode_errors_are_decode_errors() -> None:
    for cls in (MalformedMessage, UnknownEventType, SchemaViolation):
        assert issubclass(cls, DecodeError)


def test_rejection_without_a_job_id_has_the_unknown_subject() -> None:
    env = envelope(JobRejected(code="malformed_message", reason="The message is not JSON."))
    assert env.subject == "unknown"
    assert decode(encode(env)) == env


def test_decode_uses_the_registry_it_is_given() -> None:
    only_heartbeats = Registry([NodeHeartbeat])
    with pytest.raises(UnknownEventType):
        decode(encode(envelope()), only_heartbeats)
    hb = envelope(NodeHeartbeat(node="n0", seq=1))
    assert decode(encode(hb), only_heartbeats) == hb


def test_v1_heartbeat_is_upcast_to_v2_keeping_id_and_attributes() -> None:
    v1 = NodeHeartbeatV1(
        node="n0", seq=7, gpus_healthy=("g1", "g0"), gpus_unhealthy=("g2",), gpus_busy=("g0", "g2")
    )
    env = decode(encode(envelope(v1, causationid="e-0")), default_registry())
    assert env.type == "gangline.node.heartbeat.v2"
    assert (env.id, env.subject, env.causationid, env.time) == ("e-1", "n0", "e-0", T0)
    assert isinstance(env.data, NodeHeartbeat)
    assert env.data.seq == 7
    assert [(g.id, g.healthy, g.busy, g.utilization_pct) for g in env.data.gpus] == [
        ("g0", True, True, None),
        ("g1", True, False, None),
        ("g2", False, True, None),
    ]


def test_a_bad_v1_message_is_reported_against_v1_not_v2() -> None:
    body = json.loads(encode(envelope(NodeHeartbeatV1(node="n0", seq=7))))
    body["data"]["seq"] = -1
    with pytest.raises(SchemaViolation, match=r"^schema_violation: data.seq: must be >= 0 \(got -1\)$"):
        decode(raw(body))


def test_default_registry_is_built_once() -> None:
    assert codec._default() is codec._default()


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(constant: str) -> None:
    # Python's json module reads them; a message carrying one is refused, not a crash further on.
    text = encode(envelope()).decode().replace('"workers":2', f'"workers":{constant}')
    with pytest.raises(MalformedMessage, match=f"not JSON \\({constant} is not a JSON value\\)"):
        decode(text.encode())


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_nesting_depth_is_counted_on_the_bytes_outside_strings() -> None:
    assert not codec.too_deep(_nested(codec.MAX_DEPTH))
    assert codec.too_deep(_nested(codec.MAX_DEPTH + 1))
    assert codec.too_deep(b'{"a":' * 65 + b"1" + b"}" * 65)
    # Brackets inside strings (escaped quotes included) are text, not structure.
    assert not codec.too_deep(raw({"x": "[" * 10_000, "y": '\\"{' * 200}))
    assert not codec.too_deep(b"[" * 64 + b'"[[[[\\"]]"' + b"]" * 64)


def test_a_too_deep_message_is_malformed_before_any_parser_recurses() -> None:
    for body in (_nested(10_000), raw(message()).replace(b'"data":', b'"data":' + b"[" * 100, 1)):
        with pytest.raises(MalformedMessage, match="more than 64 levels deep"):
            decode(body)
    # Sixty-four levels of a real message's own structure would still be read (and then judged).
    with pytest.raises(SchemaViolation):
        decode(raw(message(command=[[[[]]]])))


def test_a_huge_subject_is_never_repeated_in_the_reason() -> None:
    body = message()
    body["subject"] = "s" * 900_000
    with pytest.raises(SchemaViolation) as err:
        decode(raw(body))
    assert len(err.value.reason) < 300 and "'j-1'" in err.value.reason


def test_values_over_the_size_limits_are_limit_exceeded_naming_the_field() -> None:
    cases = {
        "data.env": {"env": {f"E{i}": "x" for i in range(257)}},
        "data.command": {"command": ["x"] * 1025},
        "data.command[0]": {"command": ["x" * 4097]},
        "command and env together": {"env": {f"E{i}": "x" * 32_000 for i in range(32)}},
    }
    for words, data in cases.items():
        with pytest.raises(codec.LimitExceeded) as err:
            decode(raw(message(**data)))
        assert err.value.code == "limit_exceeded"
        assert words in err.value.reason, err.value.reason
        assert len(err.value.reason) < 500
    # A size problem beside another kind of problem is a plain schema violation.
    with pytest.raises(SchemaViolation) as mixed:
        decode(raw(message(workers=0, command=["x"] * 1025)))
    assert mixed.value.code == "schema_violation"


def test_strings_given_to_workers_hold_no_nul() -> None:
    for data in ({"command": ["a\x00b"]}, {"env": {"A": "\x00"}}):
        with pytest.raises(SchemaViolation, match="must match"):
            decode(raw(message(**data)))


def test_cloudevents_attributes_are_bounded() -> None:
    body = message()
    body["id"] = "e" * 513
    with pytest.raises(MalformedMessage, match="id"):
        decode(raw(body))


@pytest.mark.parametrize(
    ("where", "value"),
    [("data.command", ["a\udfff"]), ("subject", "\ud800"), ("data.env", {"K": "\udcff\udcfe"})],
)
def test_a_lone_surrogate_escape_is_malformed_not_an_encoding_crash(where: str, value: Any) -> None:
    # Found by the fuzz (tests/e2e/fuzz_requests.py): json reads "\udfff" into a str no UTF-8 can hold.
    body = message()
    if where.startswith("data."):
        body["data"][where.removeprefix("data.")] = value
    else:
        body[where] = value
    with pytest.raises(MalformedMessage, match="lone UTF-16 surrogate"):
        decode(raw(body))


def test_a_surrogate_pair_escape_is_one_character() -> None:
    assert decode(raw(message(command=["a\ud83d\ude00"]))).data.command == ("a😀",)
