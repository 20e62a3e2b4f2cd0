"""The GPU drain policy, once: what an error means for a GPU, and when repeated errors drain it.

Pure and synchronous: every time is the error's own or the caller's ``now``; nothing here reads a
clock, NVML or the log. Three outcomes for a GPU:

- ``healthy``   schedulable.
- ``degraded``  drained: no new work lands on it, the work running there stays (a reset is due).
- ``failed``    cordoned: broken now, its work is lost and restarted elsewhere.

Two rules, one place:

1. **A single event** is classified by the XID catalogue (:data:`XID_RULES`, :func:`classify_xid`):
   an XID 79 (fallen off the bus) or 48 (double-bit ECC) fails the GPU at once, an XID 63/94
   degrades it, an application XID (13, 31, 43 ...) fails only the job, 45 is noise.
   :func:`health_of` maps an action to the GPU's state.
2. **Repeated errors** that each leave the GPU as it was (job-fault XIDs, warning XIDs, correctable
   ECC errors: :func:`xid_error_kind`) degrade it once their count within :attr:`DrainPolicy.window`
   reaches that kind's limit (:func:`rate_verdict`, :class:`GpuErrorWindows`). The window is
   ``(now - window, now]``: an error exactly ``window`` old has left it.

Who applies which rule (so each decision is made by one side only):

- the **node agent** applies rule 1 to what it reads from NVML (XIDs, ECC events, the sampled
  counters: row remaps, retired pages, a lost GPU) and publishes ``gpu.health_changed`` at once; it
  applies no rate. Every countable error it reads is reported as ``gpu.error_reported`` (with a
  count: a jump of the correctable ECC counter is one report);
- **node_health** applies rule 2 over the reports of every agent, in the events' own times, so a
  restart or a replay of the log rebuilds the same windows and decides the same drains.

The numbers are :class:`DrainPolicy`'s; the services read them from the environment
(``GANGLINE_ERROR_WINDOW_S``, ``GANGLINE_JOB_FAULT_XIDS_LIMIT``, ``GANGLINE_WARNING_XIDS_LIMIT``,
``GANGLINE_CORRECTABLE_ECC_LIMIT``) with these defaults.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal

GpuHealth = Literal["healthy", "degraded", "failed"]
"""The GPU's state, as ``gpu.health_changed`` carries it."""


class Action(StrEnum):
    """What an error asks for, most severe first."""

    CORDON = "cordon"
    """Broken now: take it out, fail the job on it, reset or RMA."""
    DRAIN = "drain"
    """Works, but needs a reset: place nothing new, let the running job finish."""
    FAIL_JOB = "fail_job"
    """The job failed (its own fault, usually); the GPU is fine."""
    WATCH = "watch"
    """Record and trend."""
    IGNORE = "ignore"
    """Expected noise."""


SEVERITY: dict[Action, int] = {
    Action.CORDON: 4,
    Action.DRAIN: 3,
    Action.FAIL_JOB: 2,
    Action.WATCH: 1,
    Action.IGNORE: 0,
}

_HEALTH_OF: dict[Action, GpuHealth] = {Action.CORDON: "failed", Action.DRAIN: "degraded"}


def health_of(action: Action | None) -> GpuHealth:
    """cordon -> failed, drain -> degraded; anything milder (or nothing) leaves the GPU healthy."""
    return _HEALTH_OF.get(action, "healthy") if action is not None else "healthy"


@dataclass(frozen=True)
class XidRule:
    xid: int
    meaning: str
    action: Action
    fails_job: bool
    """Whether the job running on the GPU is lost with it."""


def _rules(*rules: XidRule) -> dict[int, XidRule]:
    return {r.xid: r for r in rules}


# After NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors) and common fleet practice;
# 63/64 read as row remapping, which is what Ampere and later report (Volta: page retirement).
XID_RULES: dict[int, XidRule] = _rules(
    XidRule(8, "GPU stopped processing (channel idle timeout)", Action.FAIL_JOB, True),
    XidRule(13, "graphics engine exception (application fault)", Action.FAIL_JOB, True),
    XidRule(31, "GPU memory page fault (application illegal address)", Action.FAIL_JOB, True),
    XidRule(32, "invalid or corrupted push buffer / PCIe DMA fault", Action.WATCH, True),
    XidRule(38, "driver firmware error", Action.DRAIN, True),
    XidRule(43, "GPU stopped processing (application fault, GPU healthy)", Action.FAIL_JOB, True),
    XidRule(45, "preemptive cleanup after a kill or earlier error", Action.IGNORE, False),
    XidRule(48, "double-bit (uncorrectable) ECC error", Action.CORDON, True),
    XidRule(61, "internal micro-controller breakpoint/warning", Action.CORDON, True),
    XidRule(62, "internal micro-controller halt", Action.CORDON, True),
    XidRule(
        63, "row remapping pending (ECC page retirement recorded); reset to activate", Action.DRAIN, False
    ),
    XidRule(64, "row remapping / page retirement failure", Action.CORDON, True),
    XidRule(68, "video decoder exception", Action.FAIL_JOB, True),
    XidRule(69, "graphics engine class error", Action.FAIL_JOB, True),
    XidRule(74, "NVLink error", Action.CORDON, True),
    XidRule(79, "GPU has fallen off the bus", Action.CORDON, True),
    XidRule(92, "high single-bit ECC error rate", Action.WATCH, False),
    XidRule(94, "contained uncorrectable ECC error; reset to remap", Action.DRAIN, True),
    XidRule(95, "uncontained uncorrectable ECC error", Action.CORDON, True),
    XidRule(109, "context switch timeout", Action.FAIL_JOB, True),
    XidRule(119, "GSP RPC timeout", Action.CORDON, True),
    XidRule(120, "GSP error", Action.CORDON, True),
    XidRule(121, "C2C link error", Action.CORDON, True),
    XidRule(140, "unrecovered ECC error in GPU memory", Action.CORDON, True),
    XidRule(143, "GPU initialisation failure", Action.CORDON, True),
    XidRule(145, "NVLink RLW error", Action.CORDON, True),
    XidRule(149, "NVLink NETIR error", Action.CORDON, True),
    XidRule(154, "GPU recovery action changed (reset or reboot required)", Action.DRAIN, False),
)

HIGH_SBE_RATE_XID = 92
"""The driver's own "many correctable ECC errors": counted with them, not as a warning."""


def classify_xid(xid: int) -> XidRule:
    """The rule for ``xid``; unknown codes are watched, never acted on blindly."""
    return XID_RULES.get(xid, XidRule(xid, f"XID {xid} not in the catalogue", Action.WATCH, False))


def event_health(xid: int) -> GpuHealth:
    """What one XID does to its GPU by itself (rule 1): 79 -> failed, 63 -> degraded, 13 -> healthy."""
    return health_of(classify_xid(xid).action)


# ---- repeated errors (rule 2) ----------------------------------------------------------------------

ErrorKind = Literal["job_fault", "warning_xid", "correctable_ecc"]
ERROR_KINDS: tuple[ErrorKind, ...] = ("job_fault", "warning_xid", "correctable_ecc")
"""In the order :func:`rate_verdict` looks at them."""

_KIND_WORDS: dict[ErrorKind, str] = {
    "job_fault": "job-fault XIDs",
    "warning_xid": "warning XIDs",
    "correctable_ecc": "correctable ECC errors",
}


def xid_error_kind(xid: int) -> ErrorKind | None:
    """Which repeated-error count an XID adds to; None: it is no repeated error (a failure, noise)."""
    if xid == HIGH_SBE_RATE_XID:
        return "correctable_ecc"
    action = classify_xid(xid).action
    if action is Action.FAIL_JOB:
        return "job_fault"
    if action is Action.WATCH:
        return "warning_xid"
    return None


@dataclass(frozen=True)
class GpuError:
    """``count`` errors of one kind seen on a GPU at ``at`` (``xid``: the XID, when it was one)."""

    kind: ErrorKind
    at: datetime
    count: int = 1
    xid: int | None = None


@dataclass(frozen=True)
class DrainPolicy:
    """The drain thresholds: a GPU with ``limit`` errors of one kind within ``window`` is degraded.

    Conservative fleet defaults; tune per GPU model. Each limit is counted on its own kind.
    """

    window: timedelta = timedelta(hours=1)
    job_fault_xids: int = 3
    """Application-class XIDs on one GPU across jobs: this many and the GPU, not the code, is suspect."""
    warning_xids: int = 3
    """Warning-class XIDs (32, unknown codes ...): this many says the GPU is getting worse."""
    correctable_ecc: int = 100
    """Correctable (single-bit) ECC errors: a rising rate comes before uncorrectable ones."""

    def __post_init__(self) -> None:
        if self.window <= timedelta(0):
            raise ValueError("window must be positive")
        if min(self.job_fault_xids, self.warning_xids, self.correctable_ecc) < 1:
            raise ValueError("every limit must be at least 1")

    def limit(self, kind: ErrorKind) -> int:
        if kind == "job_fault":
            return self.job_fault_xids
        if kind == "warning_xid":
            return self.warning_xids
        return self.correctable_ecc


@dataclass(frozen=True)
class RateVerdict:
    """A GPU to drain: ``count`` errors of ``kind`` within ``window`` reached ``limit``."""

    kind: ErrorKind
    count: int
    limit: int
    window: timedelta
    last_xid: int | None
    """The last XID counted on the GPU (the cause's XID), if any."""

    @property
    def health(self) -> GpuHealth:
        return "degraded"

    def sentence(self, where: str) -> str:
        return (
            f"{self.count} {_KIND_WORDS[self.kind]} on {where} within {self.window.total_seconds():g} s "
            f"(limit {self.limit}): drained before it fails"
        )


def verdict_of_counts(
    counts: Mapping[ErrorKind, int], policy: DrainPolicy, *, last_xid: int | None = None
) -> RateVerdict | None:
    """The first kind whose count within the window reached its limit (job faults, warnings, ECC)."""
    for kind in ERROR_KINDS:
        n = counts.get(kind, 0)
        if n >= policy.limit(kind):
            return RateVerdict(kind, n, policy.limit(kind), policy.window, last_xid)
    return None


def in_window(at: datetime, now: datetime, window: timedelta) -> bool:
    """``at`` lies in ``(now - window, now]``."""
    return now - window < at <= now


def rate_verdict(errors: Iterable[GpuError], now: datetime, policy: DrainPolicy) -> RateVerdict | None:
    """Rule 2 over one GPU's recent errors: degraded once a kind's count in the window reaches its limit."""
    counts: dict[ErrorKind, int] = {}
    last: tuple[datetime, int] | None = None
    for e in errors:
        if not in_window(e.at, now, policy.window):
            continue
        counts[e.kind] = counts.get(e.kind, 0) + e.count
        if e.xid is not None and (last is None or e.at >= last[0]):
            last = (e.at, e.xid)
    return verdict_of_counts(counts, policy, last_xid=last[1] if last else None)


class RollingCounter:
    """Event counts per key over a sliding time window. Timestamps are given, never read.

    Out-of-order timestamps are accepted; counts at or before ``now - window`` are dropped when queried.
    """

    def __init__(self, window: timedelta) -> None:
        if window <= timedelta(0):
            raise ValueError("window must be positive")
        self.window = window
        self._times: dict[Hashable, list[datetime]] = {}
        self._counts: dict[Hashable, list[int]] = {}

    def add(self, key: Hashable, at: datetime, count: int = 1) -> None:
        if count <= 0:
            return
        times = self._times.setdefault(key, [])
        counts = self._counts.setdefault(key, [])
        i = bisect.bisect_right(times, at)
        times.insert(i, at)
        counts.insert(i, count)

    def count(self, key: Hashable, now: datetime) -> int:
        times = self._times.get(key)
        if not times:
            return 0
        counts = self._counts[key]
        start = bisect.bisect_right(times, now - self.window)
        del times[:start], counts[:start]
        end = bisect.bisect_right(times, now)
        return sum(counts[:end])

    def rate_per_hour(self, key: Hashable, now: datetime) -> float:
        return self.count(key, now) / (self.window / timedelta(hours=1))

    def forget(self, key: Hashable, *, before: datetime | None = None) -> None:
        """Drop the key's counts, or with ``before`` only those older than it."""
        if before is None:
            self._times.pop(key, None)
            self._counts.pop(key, None)
            return
        times = self._times.get(key)
        if times is None:
            return
        start = bisect.bisect_left(times, before)
        del times[:start], self._counts[key][:start]
        if not times:
            self.forget(key)

    def keys(self) -> list[Hashable]:
        return list(self._times)


@dataclass
class GpuErrorWindows:
    """Rule 2 as a fold: the recent errors of many GPUs (keyed by the caller), judged by ``policy``.

    :meth:`verdict` decides what :func:`rate_verdict` decides over the same errors (recorded in the
    order given); it only keeps the windows incrementally. Like the counters, it expects ``now`` not
    to go back: what left the window is dropped.
    """

    policy: DrainPolicy = field(default_factory=DrainPolicy)
    _counters: dict[ErrorKind, RollingCounter] = field(init=False, repr=False)
    _xid_times: dict[Hashable, list[datetime]] = field(default_factory=dict, init=False, repr=False)
    _xids: dict[Hashable, list[int]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._counters = {kind: RollingCounter(self.policy.window) for kind in ERROR_KINDS}

    def record(self, key: Hashable, error: GpuError) -> None:
        self._counters[error.kind].add(key, error.at, error.count)
        if error.xid is not None:
            times = self._xid_times.setdefault(key, [])
            i = bisect.bisect_right(times, error.at)
            times.insert(i, error.at)
            self._xids.setdefault(key, []).insert(i, error.xid)

    def count(self, kind: ErrorKind, key: Hashable, now: datetime) -> int:
        return self._counters[kind].count(key, now)

    def verdict(self, key: Hashable, now: datetime) -> RateVerdict | None:
        counts = {kind: self.count(kind, key, now) for kind in ERROR_KINDS}
        return verdict_of_counts(counts, self.policy, last_xid=self._last_xid(key, now))

    def recorded(self) -> list[Hashable]:
        """Every key some error was recorded for (and not forgotten)."""
        found: dict[Hashable, None] = {}
        for counter in self._counters.values():
            found.update(dict.fromkeys(counter.keys()))
        found.update(dict.fromkeys(self._xid_times))
        return list(found)

    def forget(self, key: Hashable, *, before: datetime | None = None) -> None:
        """After a reset or a repair: the GPU's history is gone (with ``before``: what came before it, so
        errors after a reset are kept in whichever order the two are folded)."""
        for counter in self._counters.values():
            counter.forget(key, before=before)
        times = self._xid_times.get(key)
        if before is None or times is None:
            self._xid_times.pop(key, None)
            self._xids.pop(key, None)
            return
        start = bisect.bisect_left(times, before)
        del times[:start], self._xids[key][:start]
        if not times:
            self._xid_times.pop(key, None)
            self._xids.pop(key, None)

    def _last_xid(self, key: Hashable, now: datetime) -> int | None:
        """The latest XID within the window at ``now`` (older ones are dropped)."""
        times = self._xid_times.get(key)
        if not times:
            return None
        xids = self._xids[key]
        start = bisect.bisect_right(times, now - self.policy.window)
        del times[:start], xids[:start]
        end = bisect.bisect_right(times, now)
        return xids[end - 1] if end else None
