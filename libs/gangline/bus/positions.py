"""Where a decision's inputs stood: the position vector a processor stamps on its outputs (pure).

A service that folds its inputs into state and decides once per batch (placement) cannot be
replayed from its outputs alone: which inputs each batch had folded is not in the log. With
:class:`~gangline.bus.processor.InputRecording` every output record of a transaction carries

* ``gangline-inputs``: ``topic:partition:next_offset,...`` for every input partition the state has
  folded, the restore after a start included; cumulative, so it also covers the batches before
  that produced nothing. Everything below these offsets had been folded when the batch decided.
* ``gangline-incarnation``: one id per processor run (a start, a restart, a failover): a new one
  means the state was rebuilt from the log before that batch.
"""

from __future__ import annotations

from collections.abc import Mapping

INPUTS_HEADER = "gangline-inputs"
INCARNATION_HEADER = "gangline-incarnation"

Partition = tuple[str, int]
"""``(topic, partition)``."""


def format_positions(positions: Mapping[Partition, int]) -> str:
    """``topic:partition:next_offset`` per partition, sorted, comma-separated."""
    return ",".join(
        f"{topic}:{partition}:{offset}" for (topic, partition), offset in sorted(positions.items())
    )


def parse_positions(text: str) -> dict[Partition, int]:
    """The inverse of :func:`format_positions`; ``ValueError`` on a malformed value."""
    out: dict[Partition, int] = {}
    for item in filter(None, text.split(",")):
        topic, partition, offset = item.rsplit(":", 2)
        if not topic or int(partition) < 0 or int(offset) < 0:
            raise ValueError(f"not a position: {item!r}")
        out[(topic, int(partition))] = int(offset)
    return out


def merged(a: Mapping[Partition, int], b: Mapping[Partition, int]) -> dict[Partition, int]:
    """The later position of each partition in either."""
    out = dict(a)
    for key, offset in b.items():
        out[key] = max(out.get(key, 0), offset)
    return out
