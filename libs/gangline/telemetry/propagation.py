"""W3C trace context in Kafka headers.

Kafka headers are an ordered list of ``(str, bytes)`` pairs that may repeat a key; the W3C
TraceContext propagator reads and writes text. These helpers bridge the two, so the producer
and the processor never touch the propagator directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

KafkaHeaders = list[tuple[str, bytes]]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_TRACE_HEADERS = frozenset({TRACEPARENT, TRACESTATE})

_PROPAGATOR = TraceContextTextMapPropagator()


class _HeaderSetter(Setter[dict[str, str]]):
    def set(self, carrier: dict[str, str], key: str, value: str) -> None:
        carrier[key] = value


class _HeaderGetter(Getter[Sequence[tuple[str, bytes]]]):
    def get(self, carrier: Sequence[tuple[str, bytes]], key: str) -> list[str] | None:
        # The last occurrence wins, like a map built from the list; undecodable bytes are ignored.
        values = [_text(value) for name, value in carrier if name.lower() == key]
        found = [value for value in values if value is not None]
        return found[-1:] or None

    def keys(self, carrier: Sequence[tuple[str, bytes]]) -> list[str]:
        return [name for name, _ in carrier]


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("ascii")
    except UnicodeDecodeError:
        return None


def inject_headers(context: Context | None = None) -> KafkaHeaders:
    """The ``traceparent`` (and ``tracestate`` when set) headers of ``context``.

    ``context`` defaults to the current one; without a valid span in it the list is empty.
    """
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context, setter=_HeaderSetter())
    return [(name, value.encode("ascii")) for name, value in carrier.items()]


def with_trace_headers(headers: Iterable[tuple[str, bytes]], context: Context | None = None) -> KafkaHeaders:
    """``headers`` with any old trace headers replaced by those of ``context`` (default: current)."""
    kept = [(name, value) for name, value in headers if name.lower() not in _TRACE_HEADERS]
    return kept + inject_headers(context)


def extract_context(headers: Sequence[tuple[str, bytes]] | None) -> Context:
    """The remote parent context carried by Kafka headers; an empty context when none is valid."""
    return _PROPAGATOR.extract(list(headers or ()), context=Context(), getter=_HeaderGetter())


def context_from_traceparent(traceparent: str | None) -> Context:
    """The context named by a bare ``traceparent`` value (the CloudEvents extension attribute)."""
    if not traceparent:
        return Context()
    return extract_context([(TRACEPARENT, traceparent.encode("ascii", errors="replace"))])


def traceparent_of(context: Context | None = None) -> str | None:
    """The ``traceparent`` value for ``context`` (default: current), or None without a valid span."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context, setter=_HeaderSetter())
    return carrier.get(TRACEPARENT)


def span_context_of(headers: Sequence[tuple[str, bytes]] | None) -> trace.SpanContext:
    """The remote span context carried by ``headers`` (invalid when absent)."""
    return trace.get_current_span(extract_context(headers)).get_span_context()
