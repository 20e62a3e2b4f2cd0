"""Typed outcomes of extension points, and the structured reasons that explain them.

Expected outcomes are values: a plugin that rejects a node or a job returns
`Status.unschedulable(...)` with a `Reason`; nothing raises for "does not fit".
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class ReasonCode(enum.StrEnum):
    """What kind of constraint a reason is about; stable wire names."""

    GPU_TYPE = "gpu_type"
    MEMORY = "memory"
    MIG_PROFILE = "mig_profile"
    FRACTION = "fraction"
    CAPACITY = "capacity"
    GANG_SIZE = "gang_size"
    TOPOLOGY = "topology"
    FRAGMENTATION = "fragmentation"
    HEALTH = "health"
    PERMIT = "permit"
    QUOTA = "quota"
    PRIORITY = "priority"
    RESERVATION = "reservation"
    PLACED = "placed"
    SCORE = "score"
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class Reason:
    """One constraint's verdict: a code, the plugin that gave it, a sentence and typed facts.

    `details` holds the numbers behind the sentence (e.g. `{"free": 24, "largest_domain": 6}`)
    so callers can render or aggregate without parsing text.
    """

    code: ReasonCode
    plugin: str
    message: str
    details: Mapping[str, int | str] = field(default_factory=dict)

    def to_wire(self) -> dict[str, object]:
        """A JSON-ready dict with sorted detail keys."""
        return {
            "code": self.code.value,
            "plugin": self.plugin,
            "message": self.message,
            "details": {k: self.details[k] for k in sorted(self.details)},
        }


class StatusCode(enum.Enum):
    """kube-scheduler's status codes, reduced to what Gangline needs."""

    SUCCESS = "success"
    UNSCHEDULABLE = "unschedulable"
    """Does not fit now; may fit after something is released or preempted."""
    UNRESOLVABLE = "unresolvable"
    """Cannot fit on this cluster whatever is released (wrong type, bigger than the cluster)."""
    WAIT = "wait"
    """Permit only: hold the decision (the job stays pending, its reservation is released)."""
    ERROR = "error"
    """A broken input or a bug; the job is left pending with the message."""


@dataclass(frozen=True, slots=True)
class Status:
    """The outcome of one extension-point call, with its reasons."""

    code: StatusCode
    reasons: tuple[Reason, ...] = ()

    @property
    def ok(self) -> bool:
        """True for SUCCESS."""
        return self.code is StatusCode.SUCCESS

    @property
    def message(self) -> str:
        """The reasons' sentences joined, for logs."""
        return "; ".join(r.message for r in self.reasons)

    @staticmethod
    def success() -> Status:
        """The shared SUCCESS status."""
        return _SUCCESS

    @staticmethod
    def unschedulable(
        message: str,
        *,
        plugin: str,
        code: ReasonCode = ReasonCode.CAPACITY,
        details: Mapping[str, int | str] | None = None,
    ) -> Status:
        """Does not fit now, for `message`."""
        return Status(StatusCode.UNSCHEDULABLE, (Reason(code, plugin, message, details or {}),))

    @staticmethod
    def unresolvable(
        message: str,
        *,
        plugin: str,
        code: ReasonCode = ReasonCode.CAPACITY,
        details: Mapping[str, int | str] | None = None,
    ) -> Status:
        """Can never fit on this cluster, for `message`."""
        return Status(StatusCode.UNRESOLVABLE, (Reason(code, plugin, message, details or {}),))

    @staticmethod
    def wait(message: str, *, plugin: str, code: ReasonCode = ReasonCode.PERMIT) -> Status:
        """Permit says: not yet."""
        return Status(StatusCode.WAIT, (Reason(code, plugin, message),))

    @staticmethod
    def error(message: str, *, plugin: str) -> Status:
        """Broken input or a bug."""
        return Status(StatusCode.ERROR, (Reason(ReasonCode.INVALID, plugin, message),))


_SUCCESS = Status(StatusCode.SUCCESS)
