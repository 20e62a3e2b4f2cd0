"""Bytes <-> Envelope. Deterministic encoding; decoding fails with a typed, readable DecodeError (pure)."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import pydantic
from pydantic_core import ErrorDetails

from gangline.events.base import Envelope, Event, JsonObject, parse_wire_type
from gangline.events.registry import Registry, default_registry
from gangline.events.types import LIMIT_EXCEEDED

REQUIRED_ATTRIBUTES = ("specversion", "id", "source", "type", "time", "subject", "data")
MAX_DEPTH = 64
"""The deepest nesting of JSON arrays and objects a message may have; deeper is malformed. Checked on the
raw bytes before Python's json parses them (it recurses, and raises RecursionError near 1,000 levels);
the one-pass way (pydantic's parser, iterative with its own limit) reads only messages of our models,
none of which nests anywhere near that deep."""
OPTIONAL_ATTRIBUTES = ("datacontenttype", "causationid", "traceparent")


class DecodeError(Exception):
    """A message that cannot be read. ``code`` is for machines, ``reason`` for people.

    Whatever could be read before the failure is kept (``event_id``, ``event_type``, ``subject``) so the
    dead-letter record and the rejection event can name the job.
    """

    code: str = "decode_error"

    def __init__(
        self,
        reason: str,
        *,
        event_id: str | None = None,
        event_type: str | None = None,
        subject: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.event_id = event_id
        self.event_type = event_type
        self.subject = subject

    def __str__(self) -> str:
        return f"{self.code}: {self.reason}"


class MalformedMessage(DecodeError):
    """Not UTF-8, not JSON, not an object, or missing / bad CloudEvents attributes."""

    code = "malformed_message"


class UnknownEventType(DecodeError):
    """A well-formed CloudEvent whose ``type`` (or version of it) this registry does not know."""

    code = "unknown_event_type"


class SchemaViolation(DecodeError):
    """The ``data`` does not satisfy the event's model; ``problems`` lists each one, field first."""

    code = "schema_violation"

    def __init__(
        self,
        problems: list[str],
        *,
        event_id: str | None = None,
        event_type: str | None = None,
        subject: str | None = None,
    ) -> None:
        super().__init__("; ".join(problems), event_id=event_id, event_type=event_type, subject=subject)
        self.problems = problems


def encode(env: Envelope) -> bytes:
    """UTF-8 JSON with sorted keys and compact separators: one envelope, one byte string, everywhere.

    Absent optional CloudEvents attributes are left out (CloudEvents treats null as absent); inside
    ``data`` every field is written, nulls included.
    """
    body = env.model_dump(mode="json", exclude={"data"}, exclude_none=True)
    body["data"] = env.data.model_dump(mode="json")
    return dumps(body)


def dumps(obj: Any) -> bytes:
    """The canonical JSON form used for every message and every generated schema file."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def decode(raw: bytes, registry: Registry | None = None) -> Envelope:
    """Read one message, upcasting its data to the latest registered version of its type.

    Raises MalformedMessage, UnknownEventType or SchemaViolation (LimitExceeded when only sizes are
    wrong); all DecodeError.
    """
    registry = registry if registry is not None else _default()
    fast = _decode_latest(raw, registry)  # pydantic's parser has its own depth limit and never recurses
    if fast is not None:
        return fast
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedMessage(f"the message is not UTF-8 text (bad byte at offset {exc.start})") from None
    if too_deep(raw):
        raise MalformedMessage(f"the message nests arrays and objects more than {MAX_DEPTH} levels deep")
    try:
        body = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:  # too_deep() already refuses what could get here; a last guard all the same
        raise MalformedMessage("the message nests arrays and objects too deeply") from None
    except json.JSONDecodeError as exc:
        raise MalformedMessage(
            f"the message is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except _NotJson as exc:
        raise MalformedMessage(f"the message is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise MalformedMessage(f"the message is JSON {_json_kind(body)}, not a CloudEvents object")
    if _SURROGATE_ESCAPE.search(raw) is not None and _lone_surrogate(body):
        raise MalformedMessage(
            "the message escapes a lone UTF-16 surrogate (\\ud800-\\udfff): no Unicode text"
        )

    event_id = _text_or_none(body.get("id"))
    subject = _text_or_none(body.get("subject"))
    wire_type = _text_or_none(body.get("type"))
    context = {"event_id": event_id, "event_type": wire_type, "subject": subject}

    missing = [name for name in REQUIRED_ATTRIBUTES if name not in body]
    if missing:
        raise MalformedMessage(f"missing CloudEvents attribute(s): {', '.join(missing)}", **context)
    unknown = sorted(set(body) - set(REQUIRED_ATTRIBUTES) - set(OPTIONAL_ATTRIBUTES))
    if unknown:
        raise MalformedMessage(f"unknown attribute(s): {', '.join(unknown)}", **context)
    if body["specversion"] != "1.0":
        raise MalformedMessage(f'specversion must be "1.0" (got {_show(body["specversion"])})', **context)
    for name in ("id", "source", "type", "subject"):
        if not isinstance(body[name], str) or not body[name]:
            raise MalformedMessage(f"{name} must be a non-empty string (got {_show(body[name])})", **context)
    if not isinstance(body["data"], dict):
        raise MalformedMessage(f"data must be a JSON object (got JSON {_json_kind(body['data'])})", **context)

    parsed = parse_wire_type(body["type"])
    if parsed is None:
        raise UnknownEventType(
            f"type {body['type']!r} is not a Gangline event type (expected gangline.<event>.v<N>)", **context
        )
    event_type, version = parsed
    if not registry.knows(event_type, version):
        latest = registry.latest(event_type)
        known = f"; the latest known is v{latest.VERSION}" if latest is not None else ""
        raise UnknownEventType(f"event type {body['type']!r} is not known here{known}", **context)

    data = _validate_data(registry, event_type, version, body["data"], context)
    if data.subject() != body["subject"]:
        expected, got = _quoted(data.subject()), _quoted(body["subject"])
        raise SchemaViolation([f"subject: must equal the data's subject {expected} (got {got})"], **context)
    attributes = {name: body[name] for name in (*REQUIRED_ATTRIBUTES, *OPTIONAL_ATTRIBUTES) if name in body}
    attributes["type"] = data.wire_type()
    attributes["data"] = data
    try:
        return Envelope(**attributes)
    except pydantic.ValidationError as exc:
        raise MalformedMessage("; ".join(render_errors(exc.errors(), prefix="")), **context) from None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: valid JSON, but alone (not in a pair) it is no Unicode character."""


def _lone_surrogate(body: Any) -> bool:
    try:
        dumps(body)
    except UnicodeEncodeError:
        return True
    return False


_STRUCTURE = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
"""A JSON string (skipped whole, brackets inside it included) or one bracket."""


def too_deep(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether ``raw`` nests JSON arrays and objects more than ``limit`` levels deep.

    A scan of the bytes that never recurses (strings are skipped, so brackets inside them do not count);
    a message with no more than ``limit`` opening brackets in all is passed without a scan.
    """
    if raw.count(b"{") + raw.count(b"[") <= limit:
        return False
    depth = 0
    for match in _STRUCTURE.finditer(raw):
        first = match.group()[0]
        if first in _OPENING:
            depth += 1
            if depth > limit:
                return True
        elif first in _CLOSING:
            depth -= 1
    return False


_OPENING = frozenset(b"[{")
_CLOSING = frozenset(b"]}")


class LimitExceeded(SchemaViolation):
    """The ``data`` is valid but for values over the size limits: too long, too many, too large in all."""

    code = LIMIT_EXCEEDED


_SIZE_ERRORS = frozenset({"string_too_long", "too_long", LIMIT_EXCEEDED})


class _NotJson(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    # Python's json reads NaN, Infinity and -Infinity; JSON has no such values.
    raise _NotJson(f"{name} is not a JSON value")


_WIRE_TYPE_BYTES = re.compile(rb'"type"\s*:\s*"gangline\.([a-z][a-z0-9_.]*)\.v([0-9]+)"')


def last_wire_type(raw: bytes | None) -> tuple[str, int] | None:
    """The event type and version the raw bytes name last (``"type":"gangline.<type>.v<N>"``), without
    decoding; None when none is found. Our codec sorts keys, so an envelope's own ``type`` comes after
    ``data``: a hint to check against the decoded message, never a verdict."""
    if not raw:
        return None
    found = _WIRE_TYPE_BYTES.findall(raw)
    if not found:
        return None
    name, version = found[-1]
    return name.decode("ascii"), int(version)


def _decode_latest(raw: bytes, registry: Registry) -> Envelope | None:
    """The envelope of a valid message of a type's latest version, read in one pass; else None.

    The type is found in the raw bytes (the last ``"type":"gangline.<type>.v<N>"``; our codec sorts
    keys, so the envelope's own comes after ``data``), then the whole message is validated at once by
    an envelope model whose ``data`` is that class, strictly, as :func:`decode` does in its steps. On
    any doubt (another version, a type not found or not the one named, any validation error) it
    returns None and :func:`decode` takes the long way, which accepts the same messages and words the
    errors; this way only saves the second JSON pass and the re-encoding of ``data``.
    """
    named = last_wire_type(raw)
    if named is None:
        return None
    event_type, version = named
    cls = registry.get(event_type, version)
    if cls is None or cls is not registry.latest(event_type):
        return None
    try:
        typed = _typed_envelope(cls).model_validate_json(raw, strict=True)
    except (pydantic.ValidationError, ValueError):
        return None
    # The typed model only narrows ``data``: same fields, validators and layout. Handed out as a plain
    # Envelope, so it compares, copies and serialises exactly like one built by the long way.
    object.__setattr__(typed, "__class__", Envelope)
    return typed


class _TypedEnvelope(Envelope):
    """The base of the typed envelopes: without attribute docstrings, whose lookup (the source of a class
    made at run time, searched through every loaded module) made each type's first decode in a service
    cost tens of milliseconds; the fields keep the descriptions Envelope's docstrings gave them."""

    model_config = pydantic.ConfigDict(use_attribute_docstrings=False)  # merged into Envelope's


@functools.cache
def _typed_envelope(cls: type[Event]) -> type[Envelope]:
    model: type[Envelope] = pydantic.create_model(
        f"{cls.__name__}Envelope", __base__=_TypedEnvelope, data=(cls, ...)
    )
    return model


def _validate_data(
    registry: Registry, event_type: str, version: int, data: JsonObject, context: dict[str, str | None]
) -> Event:
    """Validate against the message's own version when its class is still registered, then upcast."""
    latest = registry.latest(event_type)
    assert latest is not None  # registry.knows() said so
    own = registry.get(event_type, version)
    if own is not None:
        validated = _strict(own, data, context)
        if own is latest:
            return validated
        data = validated.model_dump(mode="json")
    return _strict(latest, registry.upcast(event_type, version, data), context)


def _strict(cls: type[Event], data: JsonObject, context: dict[str, str | None]) -> Event:
    # JSON-mode strict validation: "3" is not an int and 1.5 is not a count, as a wire contract should be.
    try:
        return cls.model_validate_json(dumps(data), strict=True)
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        kind = LimitExceeded if all(error["type"] in _SIZE_ERRORS for error in errors) else SchemaViolation
        raise kind(render_errors(errors, prefix="data"), **context) from None


def render_errors(errors: list[ErrorDetails], *, prefix: str) -> list[str]:
    """pydantic errors as "data.workers: must be >= 1 (got 0)", one string per problem."""
    return [f"{_location(prefix, error['loc'])}: {_message(error)}" for error in errors]


def _location(prefix: str, loc: tuple[int | str, ...]) -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part:
            path = f"{path}.{part}" if path else part
    return path or "message"


def _message(error: ErrorDetails) -> str:
    kind = error["type"]
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    got = f" (got {_show(error['input'])})"
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a field of this event"
    if kind in _BOUNDS:
        return f"must be {_BOUNDS[kind]} {_show(next(iter(ctx.values())))}{got}"
    if kind == "string_too_short":
        return (
            "must not be empty"
            if ctx.get("min_length") == 1
            else f"needs at least {ctx['min_length']} characters"
        ) + got
    if kind == "string_too_long":
        return f"must be at most {ctx['max_length']} characters{got}"
    if kind == "too_short":
        return f"needs at least {ctx['min_length']} item(s){got}"
    if kind == "too_long":
        return f"takes at most {ctx['max_length']} item(s){got}"
    if kind == LIMIT_EXCEEDED:
        return error["msg"]
    if kind == "string_pattern_mismatch":
        return f"must match {ctx['pattern']}{got}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}{got}"
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        return f"must be an integer{got}"
    if kind in {
        "string_type",
        "bool_type",
        "dict_type",
        "list_type",
        "tuple_type",
        "float_type",
        "model_type",
    }:
        return f"must be {_TYPE_NAMES[kind]}{got}"
    if kind in {"value_error", "assertion_error"}:
        return str(ctx.get("error") or error["msg"])
    return f"{error['msg'][:1].lower()}{error['msg'][1:]}{got}"


_BOUNDS = {
    "greater_than_equal": ">=",
    "greater_than": ">",
    "less_than_equal": "<=",
    "less_than": "<",
    "multiple_of": "a multiple of",
}
_TYPE_NAMES = {
    "string_type": "a string",
    "bool_type": "true or false",
    "dict_type": "an object",
    "list_type": "an array",
    "tuple_type": "an array",
    "float_type": "a number",
    "model_type": "an object",
}


def _show(value: Any) -> str:
    try:
        shown = json.dumps(value, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _quoted(text: str) -> str:
    """``repr(text)``, cut to 80 characters (a reason never repeats a huge input)."""
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "null" if value is None else type(value).__name__


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


@functools.cache
def _default() -> Registry:
    return default_registry()
