"""Where a decision's inputs stood: the position vector a processor stamps on its outputs (pure).

A service that folds its inputs into state and decides once per batch (placement) cannot be
replayed from its outputs alone: which inputs each batch had folded is not in the log. With
:class:`~gangline.bus.processor.InputRecording` every output record of a transaction carries

* ``gangline-inputs``: ``topic:partition:next_offset,...`` for every input partition the state has
  folded, the restore after a start included; cumulative, so it also covers the batches before
  that produced nothing. Everything below these offsets had been folded when the batch decided.
* ``gangline-incarnation``: one id per processor run (a start, a restart, a failover): a new one
  means the state was rebuilt from the log before that batch.
* ``gangline-batch``: what this batch consumed, ``topic:partition:first:next`` per partition in the
  order the processor handled them (:func:`format_batch`). A service that decides per event is
  replayed from it: the exact events, in the exact order, of each batch that had outputs.
* ``gangline-restored``, ``gangline-resumed`` and ``gangline-started``, on the outputs of the first
  transaction with outputs of a run only: where the restore from the log stopped
  (``topic:partition:next_offset``; the inputs header is the later of it and the batch), where the
  consumer resumed each input partition first assigned to the run (its committed offset: what the
  run consumed before its first outputs starts there), and when the run's state was created
  (RFC 3339; a service whose decisions count time from its start needs it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

INPUTS_HEADER = "gangline-inputs"
INCARNATION_HEADER = "gangline-incarnation"
BATCH_HEADER = "gangline-batch"
RESTORED_HEADER = "gangline-restored"
RESUMED_HEADER = "gangline-resumed"
STARTED_HEADER = "gangline-started"

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


BatchRange = tuple[str, int, int, int]
"""``(topic, partition, first_offset, next_offset)``: the records of one partition a batch consumed."""


def format_batch(ranges: Sequence[BatchRange]) -> str:
    """``topic:partition:first:next`` per partition, in the given (handling) order, comma-separated."""
    return ",".join(f"{topic}:{partition}:{first}:{end}" for topic, partition, first, end in ranges)


def parse_batch(text: str) -> list[BatchRange]:
    """The inverse of :func:`format_batch`; ``ValueError`` on a malformed value."""
    out: list[BatchRange] = []
    for item in filter(None, text.split(",")):
        topic, partition, first, end = item.rsplit(":", 3)
        if not topic or int(partition) < 0 or not 0 <= int(first) <= int(end):
            raise ValueError(f"not a batch range: {item!r}")
        out.append((topic, int(partition), int(first), int(end)))
    return out
