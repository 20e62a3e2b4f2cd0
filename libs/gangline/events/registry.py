"""The explicit catalogue of event types the codec knows, and the upcasters between their versions (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gangline.events import allocations, jobs, nodes, queues
from gangline.events.base import EVENT_TYPE_RE, Event, JsonObject, Upcaster

__all__ = ["Registry", "Upcaster", "default_registry"]


class Registry:
    """Event classes by (TYPE, VERSION) plus upcasters keyed by (TYPE, from_version).

    Nothing registers itself at import: build one from a list. Every version older than the latest of
    its type must have an unbroken chain of upcasters up to the latest, so any message can be read as
    the latest version.
    """

    def __init__(
        self,
        events: Iterable[type[Event]],
        upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
    ) -> None:
        self._classes: dict[tuple[str, int], type[Event]] = {}
        for cls in events:
            if not EVENT_TYPE_RE.match(cls.TYPE) or cls.VERSION < 1:
                raise ValueError(f"{cls.__name__}: bad TYPE {cls.TYPE!r} or VERSION {cls.VERSION!r}")
            key = (cls.TYPE, cls.VERSION)
            if key in self._classes:
                raise ValueError(
                    f"{cls.wire_type()} registered twice ({self._classes[key].__name__}, {cls.__name__})"
                )
            self._classes[key] = cls
        self._upcasters: dict[tuple[str, int], Upcaster] = dict(upcasters or {})
        self._latest: dict[str, type[Event]] = {}
        for (event_type, _version), cls in sorted(self._classes.items()):
            self._latest[event_type] = cls
        for event_type, from_version in self._upcasters:
            latest = self._latest.get(event_type)
            if latest is None or from_version >= latest.VERSION or from_version < 1:
                raise ValueError(
                    f"upcaster ({event_type!r}, {from_version}) does not lead to a registered version"
                )
        for event_type, version in self._classes:
            for step in range(version, self._latest[event_type].VERSION):
                if (event_type, step) not in self._upcasters:
                    raise ValueError(f"no upcaster from {event_type} v{step} to v{step + 1}")

    def event_classes(self) -> list[type[Event]]:
        """Every registered class, sorted by (TYPE, VERSION)."""
        return [self._classes[key] for key in sorted(self._classes)]

    def wire_types(self) -> list[str]:
        return [cls.wire_type() for cls in self.event_classes()]

    def latest(self, event_type: str) -> type[Event] | None:
        """The newest registered version of a type, the one decoding produces."""
        return self._latest.get(event_type)

    def get(self, event_type: str, version: int) -> type[Event] | None:
        """The class of exactly that version, if it is still registered."""
        return self._classes.get((event_type, version))

    def knows(self, event_type: str, version: int) -> bool:
        """True when a message of that version can be decoded (upcasters lead from it to the latest)."""
        latest = self._latest.get(event_type)
        if latest is None or version < 1 or version > latest.VERSION:
            return False
        return all((event_type, step) in self._upcasters for step in range(version, latest.VERSION))

    def upcast(self, event_type: str, version: int, data: JsonObject) -> JsonObject:
        """Apply upcasters one version at a time until ``data`` is shaped like the latest version."""
        latest = self._latest[event_type]
        for step in range(version, latest.VERSION):
            data = self._upcasters[(event_type, step)](data)
        return data


def default_registry() -> Registry:
    """Every public Gangline event type and the upcasters between their versions."""
    return Registry(
        [*jobs.EVENTS, *allocations.EVENTS, *nodes.EVENTS, *queues.EVENTS],
        upcasters={**nodes.UPCASTERS},
    )


JOB_EVENT_TYPES: frozenset[str] = frozenset(cls.wire_type() for cls in (*jobs.EVENTS, *allocations.EVENTS))
"""Wire types (latest versions) whose subject is a job id."""

NODE_EVENT_TYPES: frozenset[str] = frozenset(cls.wire_type() for cls in nodes.EVENTS)
"""Wire types whose subject is a node id."""

QUEUE_EVENT_TYPES: frozenset[str] = frozenset(cls.wire_type() for cls in queues.EVENTS)
"""Wire types whose subject is a queue name."""
