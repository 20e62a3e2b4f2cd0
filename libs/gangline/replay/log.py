"""The recorded log as records: one Kafka message each, and its JSONL file form (pure + files).

A JSONL line (what `gangline export` writes, what `gangline replay --from FILE` reads):

```json
{"topic": "allocations.log", "partition": 0, "offset": 17, "key": "job-42", "timestamp_ms": 1700000000000,
 "headers": {"gangline-chain-hash": "…", "gangline-chain-prev": "…", "gangline-chain-seq": "5"},
 "envelope": {"specversion": "1.0", "id": "…", "type": "gangline.allocation.granted.v1", "data": {…}, …}}
```

`envelope` is the CloudEvent as a JSON object (the Kafka value, parsed); header values are text.
Records are kept in the order of the file; `by_partition_order` sorts them per (topic, partition,
offset) as Kafka delivers them.

`LogSource` is the seam between replay and where the log lives: `FileSource` reads a JSONL file;
a Kafka source (the bus library's consumer reading each topic from the beginning) plugs in by
implementing the same one-method protocol.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gangline.events.base import JsonObject


class LogFormatError(ValueError):
    """A JSONL line that is not a log record; names the file and line."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One message of a topic partition."""

    topic: str
    partition: int
    offset: int
    key: str | None
    envelope: JsonObject
    headers: Mapping[str, str] = field(default_factory=dict)
    timestamp_ms: int | None = None

    @property
    def type(self) -> str:
        """The CloudEvents type, e.g. `gangline.allocation.granted.v1` ('' when absent)."""
        t = self.envelope.get("type")
        return t if isinstance(t, str) else ""

    @property
    def event_id(self) -> str:
        """The CloudEvents id ('' when absent)."""
        i = self.envelope.get("id")
        return i if isinstance(i, str) else ""

    @property
    def where(self) -> str:
        """`topic[partition]@offset`, for messages."""
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def to_json(self) -> JsonObject:
        """The JSONL object of this record."""
        out: JsonObject = {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "key": self.key,
            "headers": dict(sorted(self.headers.items())),
            "envelope": self.envelope,
        }
        if self.timestamp_ms is not None:
            out["timestamp_ms"] = self.timestamp_ms
        return out


def record_from_json(obj: Any, where: str = "record") -> LogRecord:
    """Validate a parsed JSONL object."""
    if not isinstance(obj, dict):
        raise LogFormatError(f"{where}: a record is a JSON object")
    topic, partition, offset = obj.get("topic"), obj.get("partition"), obj.get("offset")
    if not isinstance(topic, str) or not topic:
        raise LogFormatError(f"{where}: topic must be a non-empty string")
    if not isinstance(partition, int) or not isinstance(offset, int) or partition < 0 or offset < 0:
        raise LogFormatError(f"{where}: partition and offset must be non-negative integers")
    key = obj.get("key")
    if key is not None and not isinstance(key, str):
        raise LogFormatError(f"{where}: key must be a string or null")
    env = obj.get("envelope")
    if not isinstance(env, dict):
        raise LogFormatError(f"{where}: envelope must be a JSON object")
    headers = obj.get("headers") or {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise LogFormatError(f"{where}: headers must map strings to strings")
    ts = obj.get("timestamp_ms")
    if ts is not None and not isinstance(ts, int):
        raise LogFormatError(f"{where}: timestamp_ms must be an integer")
    return LogRecord(topic, partition, offset, key, env, headers, ts)


def read_jsonl(path: str | Path) -> Iterator[LogRecord]:
    """Records of a JSONL file, in file order (blank lines skipped)."""
    p = Path(path)
    with p.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise LogFormatError(f"{p}:{n}: not JSON ({e.msg})") from None
            yield record_from_json(obj, f"{p}:{n}")


def write_jsonl(records: Iterable[LogRecord], path: str | Path) -> int:
    """Write records as JSONL (sorted keys, one per line); how many were written."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False))
            fh.write("\n")
            n += 1
    return n


def by_partition_order(records: Iterable[LogRecord]) -> list[LogRecord]:
    """Records sorted by (topic, partition, offset)."""
    return sorted(records, key=lambda r: (r.topic, r.partition, r.offset))


class LogSource(Protocol):
    """Where a recorded log is read from (a file now; Kafka through the bus consumer later)."""

    def records(self, topics: Sequence[str] | None = None) -> list[LogRecord]:
        """Every record of `topics` (all when None), in file / delivery order."""


class FileSource:
    """A JSONL file written by `gangline export`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def records(self, topics: Sequence[str] | None = None) -> list[LogRecord]:
        wanted = set(topics) if topics is not None else None
        return [r for r in read_jsonl(self.path) if wanted is None or r.topic in wanted]
