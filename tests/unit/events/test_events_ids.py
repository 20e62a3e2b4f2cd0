"""Derived ids are the name-based (version 5) UUIDs of their cause and parts in the events' namespace."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from gangline.events.ids import _NAMESPACE, derived_id


@settings(max_examples=300, deadline=None)
@given(st.text(), st.lists(st.one_of(st.text(), st.integers(), st.floats(allow_nan=False)), max_size=4))
def test_a_derived_id_is_the_uuid5_of_its_cause_and_parts(cause: str, parts: list[object]) -> None:
    expected = str(uuid.uuid5(_NAMESPACE, "/".join([cause, *map(str, parts)])))
    assert derived_id(cause, *parts) == expected


def test_known_ids_stay_what_they_were() -> None:
    assert derived_id("cause", "granted", 3) == str(uuid.uuid5(_NAMESPACE, "cause/granted/3"))
    assert derived_id("") == str(uuid.uuid5(_NAMESPACE, ""))
