"""Events as any Kafka producer writes them: plain CloudEvents JSON, no Gangline models (what the benches
and the end-to-end tests send, to show that a client needs nothing of Gangline's code)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any


def plain_event(kind: str, job_id: str, data: Mapping[str, Any], *, source: str) -> bytes:
    """A ``gangline.<kind>.v1`` envelope about ``job_id`` (``data`` gains the job id), a fresh id, now."""
    return json.dumps(
        {
            "specversion": "1.0",
            "id": str(uuid.uuid4()),
            "source": source,
            "type": f"gangline.{kind}.v1",
            "time": datetime.now(UTC).isoformat(),
            "subject": job_id,
            "datacontenttype": "application/json",
            "data": {"job_id": job_id, **data},
        }
    ).encode()
