"""decode's one-pass way (a type's latest version, read by one strict validation) against the long way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gangline.events import codec
from gangline.events.base import Envelope
from gangline.events.codec import DecodeError, decode, encode
from gangline.events.examples import example_envelopes
from gangline.events.registry import default_registry

EXAMPLES = example_envelopes()
LATEST = {
    wire: env for wire, env in EXAMPLES.items() if type(env.data) is default_registry().latest(env.data.TYPE)
}


def long_way(raw: bytes) -> Envelope | str:
    """What decode gave before the one-pass way: the envelope, or the error it raised."""
    saved = codec._decode_latest
    codec._decode_latest = lambda raw, registry: None
    try:
        return decode(raw)
    except DecodeError as error:
        return f"{type(error).__name__}: {error}"
    finally:
        codec._decode_latest = saved


def either_way(raw: bytes) -> Envelope | str:
    try:
        return decode(raw)
    except DecodeError as error:
        return f"{type(error).__name__}: {error}"


@pytest.mark.parametrize("wire", sorted(LATEST))
def test_every_latest_example_is_read_in_one_pass_as_a_plain_envelope(wire: str) -> None:
    raw = encode(EXAMPLES[wire])
    fast = codec._decode_latest(raw, default_registry())
    assert fast is not None
    assert type(fast) is Envelope
    assert fast == EXAMPLES[wire] == long_way(raw)
    assert fast.model_fields_set == decode(raw).model_fields_set
    assert encode(fast) == raw
    copied = fast.model_copy(update={"causationid": "other"})
    assert type(copied) is Envelope and copied.causationid == "other"


def test_an_older_version_takes_the_long_way_and_is_upcast() -> None:
    raw = encode(EXAMPLES["gangline.node.heartbeat.v1"])
    assert codec._decode_latest(raw, default_registry()) is None
    assert decode(raw).type == "gangline.node.heartbeat.v2"


def test_a_type_named_inside_data_after_the_envelope_type_falls_back() -> None:
    # The last "type" in the bytes is a decoy: the one-pass way must not trust it.
    body = json.loads(encode(EXAMPLES["gangline.job.requested.v1"]))
    raw = json.dumps(body, sort_keys=False).encode()[:-1] + b',"zz":{"type":"gangline.job.started.v1"}}'
    assert codec._decode_latest(raw, default_registry()) is None
    assert either_way(raw) == long_way(raw)
    assert "zz" in str(either_way(raw))


@pytest.mark.parametrize(
    "change",
    [
        {"subject": "someone-else"},
        {"specversion": "0.3"},
        {"time": "2025-03-01T09:00:00"},
        {"id": ""},
        {"extra": 1},
        {"traceparent": "not-a-traceparent"},
        {"causationid": 7},
    ],
)
def test_bad_envelopes_are_refused_with_the_long_ways_words(change: dict[str, Any]) -> None:
    body = json.loads(encode(EXAMPLES["gangline.allocation.granted.v1"])) | change
    raw = json.dumps(body).encode()
    assert isinstance(long_way(raw), str)
    assert either_way(raw) == long_way(raw)


def _values() -> st.SearchStrategy[Any]:
    leaf = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False),
        st.text(max_size=8),
        st.sampled_from(["2025-03-01T09:00:00Z", "H100-SXM5-80GB", "1g.10gb", "", "0", "1.5"]),
    )
    return st.recursive(
        leaf,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
        max_leaves=6,
    )


def _paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*at, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _paths(inner, (*at, index))


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(copy[head], rest, new)
    return copy


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    wire=st.sampled_from(sorted(LATEST)),
    pick=st.integers(min_value=0, max_value=10_000),
    new=_values(),
    drop=st.booleans(),
)
def test_any_change_to_a_message_is_read_alike_both_ways(wire: str, pick: int, new: Any, drop: bool) -> None:
    """Whatever one field becomes (or if it goes), both ways accept the same envelope or refuse alike."""
    body = json.loads(encode(EXAMPLES[wire]))
    paths = [p for p in _paths(body) if p]
    path = paths[pick % len(paths)]
    if drop and isinstance(path[-1], str):
        parent = body
        for part in path[:-1]:
            parent = parent[part]
        del parent[path[-1]]
        changed = body
    else:
        changed = _replace(body, path, new)
    raw = json.dumps(changed).encode()
    assert either_way(raw) == long_way(raw)
