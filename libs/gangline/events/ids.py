"""Deterministic event and allocation ids: a retried transaction produces the same ids again."""

from __future__ import annotations

import uuid

_NAMESPACE = uuid.UUID("2b8f6d0e-5c1a-4f7e-9a3d-8e4b1c6f0a25")


def derived_id(cause_id: str, *parts: object) -> str:
    """The id of an event caused by ``cause_id``; ``parts`` tell apart several outputs of one cause."""
    return str(uuid.uuid5(_NAMESPACE, "/".join([cause_id, *map(str, parts)])))
