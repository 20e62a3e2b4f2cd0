"""Each golden example in schemas/examples decodes, re-encodes to the same bytes and obeys its JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from gangline.events import codec
from gangline.events.base import parse_wire_type
from gangline.events.nodes import NodeHeartbeat
from gangline.events.registry import default_registry

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
EXAMPLES = sorted((SCHEMAS / "examples").glob("*.json"))
REGISTRY = default_registry()


def _schema_for(wire_type: str) -> dict[str, object]:
    parsed = parse_wire_type(wire_type)
    assert parsed is not None
    event_type, version = parsed
    schema: dict[str, object] = json.loads((SCHEMAS / "events" / event_type / f"v{version}.json").read_text())
    return schema


def test_there_is_a_golden_example_for_every_registered_version() -> None:
    names = {p.name for p in EXAMPLES}
    expected = {f"{cls.TYPE}.v{cls.VERSION}.json" for cls in REGISTRY.event_classes()}
    assert names == expected


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_golden_example_obeys_its_json_schema_and_the_envelope_schema(path: Path) -> None:
    message = json.loads(path.read_bytes())
    jsonschema.Draft202012Validator(_schema_for(message["type"])).validate(message)
    jsonschema.Draft202012Validator(json.loads((SCHEMAS / "envelope.json").read_text())).validate(message)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_golden_example_round_trips_byte_for_byte(path: Path) -> None:
    raw = path.read_bytes().removesuffix(b"\n")
    env = codec.decode(raw, REGISTRY)
    if env.type == json.loads(raw)["type"]:
        assert codec.encode(env) == raw
    else:
        # An older version: decoding upcasts it, and the upcast envelope is stable from then on.
        assert codec.encode(codec.decode(codec.encode(env), REGISTRY)) == codec.encode(env)


def test_heartbeat_v1_golden_decodes_to_v2() -> None:
    raw = (SCHEMAS / "examples" / "node.heartbeat.v1.json").read_bytes()
    env = codec.decode(raw, REGISTRY)
    assert env.type == "gangline.node.heartbeat.v2"
    assert isinstance(env.data, NodeHeartbeat)
    assert [(g.id, g.healthy, g.busy) for g in env.data.gpus] == [
        ("gpu0", True, True),
        ("gpu1", True, False),
        ("gpu2", True, False),
        ("gpu3", False, False),
    ]
    assert env.id == json.loads(raw)["id"]


def test_json_schema_rejects_what_the_model_rejects() -> None:
    message = json.loads((SCHEMAS / "examples" / "job.requested.v1.json").read_bytes())
    message["data"]["workers"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(_schema_for(message["type"])).validate(message)
    with pytest.raises(codec.SchemaViolation, match=r"data\.workers: must be >= 1 \(got 0\)"):
        codec.decode(json.dumps(message).encode(), REGISTRY)
