"""Deterministic event and allocation ids: a retried transaction produces the same ids again."""

from __future__ import annotations

import hashlib
import uuid

_NAMESPACE = uuid.UUID("2b8f6d0e-5c1a-4f7e-9a3d-8e4b1c6f0a25")
_PREFIX = _NAMESPACE.bytes


def derived_id(cause_id: str, *parts: object) -> str:
    """The id of an event caused by ``cause_id``; ``parts`` tell apart several outputs of one cause.

    ``str(uuid.uuid5(namespace, name))``, written out without building a UUID (every event asks it).
    """
    name = "/".join([cause_id, *map(str, parts)])
    digest = bytearray(hashlib.sha1(_PREFIX + name.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    x = digest.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"
