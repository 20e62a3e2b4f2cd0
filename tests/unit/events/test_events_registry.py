"""The registry: explicit, consistent, and able to upcast any old version to the latest."""

from __future__ import annotations

from typing import Any

import pytest

from gangline.events.base import Event, JsonObject
from gangline.events.nodes import NodeHeartbeat, NodeHeartbeatV1, heartbeat_v1_to_v2
from gangline.events.registry import Registry, default_registry


class ThingV1(Event):
    TYPE = "thing.happened"
    VERSION = 1
    name: str

    def subject(self) -> str:
        return self.name


class ThingV2(Event):
    TYPE = "thing.happened"
    VERSION = 2
    title: str

    def subject(self) -> str:
        return self.title


class ThingV3(Event):
    TYPE = "thing.happened"
    VERSION = 3
    title: str
    tags: tuple[str, ...]

    def subject(self) -> str:
        return self.title


def rename(data: JsonObject) -> JsonObject:
    return {"title": data["name"]}


def tag(data: JsonObject) -> JsonObject:
    return {**data, "tags": ["from-v2"]}


def test_latest_is_the_highest_version_whatever_the_order_given() -> None:
    registry = Registry(
        [ThingV3, ThingV1, ThingV2], {("thing.happened", 1): rename, ("thing.happened", 2): tag}
    )
    assert registry.latest("thing.happened") is ThingV3
    assert registry.get("thing.happened", 1) is ThingV1
    assert registry.latest("nothing") is None
    assert registry.event_classes() == [ThingV1, ThingV2, ThingV3]


def test_upcasters_chain_one_version_at_a_time() -> None:
    registry = Registry([ThingV3], {("thing.happened", 1): rename, ("thing.happened", 2): tag})
    assert registry.upcast("thing.happened", 1, {"name": "x"}) == {"title": "x", "tags": ["from-v2"]}
    assert registry.upcast("thing.happened", 2, {"title": "y"}) == {"title": "y", "tags": ["from-v2"]}
    assert registry.upcast("thing.happened", 3, {"title": "z", "tags": []}) == {"title": "z", "tags": []}


def test_knows_versions_that_can_reach_the_latest() -> None:
    registry = Registry([ThingV3], {("thing.happened", 2): tag})
    assert registry.knows("thing.happened", 3)
    assert registry.knows("thing.happened", 2)
    assert not registry.knows("thing.happened", 1)  # no upcaster from v1
    assert not registry.knows("thing.happened", 4)
    assert not registry.knows("other.thing", 1)


def test_registering_a_version_twice_is_refused() -> None:
    with pytest.raises(ValueError, match=r"gangline.thing.happened.v1 registered twice"):
        Registry([ThingV1, ThingV1])


def test_an_old_version_without_an_upcaster_to_the_latest_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no upcaster from thing\.happened v1 to v2"):
        Registry([ThingV1, ThingV2])


def test_an_upcaster_that_leads_nowhere_is_refused() -> None:
    with pytest.raises(ValueError, match="does not lead to a registered version"):
        Registry([ThingV1], {("thing.happened", 1): rename})
    with pytest.raises(ValueError, match="does not lead to a registered version"):
        Registry([ThingV2], {("unknown.type", 1): rename})


@pytest.mark.parametrize(("type_", "version"), [("Thing.Happened", 1), ("thing..happened", 1), ("thing", 0)])
def test_bad_type_names_or_versions_are_refused(type_: str, version: int) -> None:
    bad: Any = type("Bad", (ThingV1,), {"TYPE": type_, "VERSION": version})
    with pytest.raises(ValueError, match="bad TYPE"):
        Registry([bad])


def test_default_registry_has_heartbeat_v1_and_v2() -> None:
    registry = default_registry()
    assert registry.latest("node.heartbeat") is NodeHeartbeat
    assert registry.get("node.heartbeat", 1) is NodeHeartbeatV1
    assert registry.knows("node.heartbeat", 1)
    assert "gangline.job.requested.v1" in registry.wire_types()
    assert registry.latest("job.requested") is not None
    assert registry.latest("job.requested").VERSION == 1  # type: ignore[union-attr]


def test_default_registry_is_a_fresh_explicit_object() -> None:
    assert default_registry() is not default_registry()
    assert default_registry().wire_types() == default_registry().wire_types()


def test_heartbeat_upcaster_output_is_a_valid_v2() -> None:
    v1 = NodeHeartbeatV1(
        node="n0", seq=3, gpus_healthy=("a", "b"), gpus_unhealthy=("b", "c"), gpus_busy=("a",)
    )
    v2 = NodeHeartbeat.model_validate(heartbeat_v1_to_v2(v1.model_dump(mode="json")))
    # A GPU listed both healthy and unhealthy is taken as unhealthy: the safe reading.
    assert [(g.id, g.healthy, g.busy) for g in v2.gpus] == [
        ("a", True, True),
        ("b", False, False),
        ("c", False, False),
    ]
