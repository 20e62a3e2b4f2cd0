"""Skipping, before decoding, the records a service has no use for (decoding is most of its CPU).

The event type is read from the raw bytes: the last ``"type":"gangline.<type>.v<N>"`` in the record
(our codec sorts keys, so the envelope's own ``type`` comes after ``data``). When the type cannot
be found that way the record is decoded as usual, so a skip is always safe.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping

from gangline.bus.records import KafkaRecord
from gangline.events.codec import last_wire_type

Wanted = Mapping[str, Callable[[], bool] | bool]
"""Event type (e.g. "job.admitted") → whether to decode it (a callable is asked each time)."""


def wire_type_of(value: bytes | None) -> str | None:
    """The event type named by a raw record ("job.admitted"), or None when it cannot be told cheaply."""
    named = last_wire_type(value)
    return named[0] if named is not None else None


def select_types(wanted: Wanted, *, not_ours: frozenset[str] = frozenset()) -> Callable[[KafkaRecord], bool]:
    """A processor ``select``: decode the types in ``wanted`` (and anything unrecognisable), skip the rest.

    On the topics in ``not_ours`` an unrecognisable record is skipped too: another service owns that
    topic's dead-lettering (e.g. admission for jobs.requests), so it is not dead-lettered twice.
    """

    def select(record: KafkaRecord) -> bool:
        kind = wire_type_of(record.value)
        if kind is None:
            return record.topic not in not_ours
        want = wanted.get(kind, False)
        return want() if callable(want) else want

    return select


RESIZE_GRANT = b'"resizes":"'
"""How the codec writes a grant that names the allocation it resizes (``resizes`` not null)."""


def or_resize_grants(select: Callable[[KafkaRecord], bool]) -> Callable[[KafkaRecord], bool]:
    """``select``, and every ``allocation.granted`` of an elastic resize (written by preemption, so news
    to placement, which skips the grants it wrote itself)."""

    def wanted(record: KafkaRecord) -> bool:
        if select(record):
            return True
        value = record.value
        return value is not None and RESIZE_GRANT in value and wire_type_of(value) == "allocation.granted"

    return wanted


def unless_keyed_by(
    ids: Container[str], select: Callable[[KafkaRecord], bool]
) -> Callable[[KafkaRecord], bool]:
    """``select``, but a record whose key is in ``ids`` is skipped before anything is decoded.

    For topics keyed by job id and a service that retires finished jobs: nothing read about a retired
    job changes its state, so the record need not cost a decode. ``ids`` is read at each record, so it
    may grow while the service runs.
    """

    def wanted(record: KafkaRecord) -> bool:
        key = record.key
        if key is not None and key.decode("utf-8", "replace") in ids:
            return False
        return select(record)

    return wanted
